"""Lighthouse Attention: hierarchical, parameter-free selection around stock causal SDPA."""
from .attention import causal_attention
from .config import LighthouseConfig
from .gather import gather_subsequence, pyramid_index
from .layer import LighthouseAttention, lighthouse_attention
from .ordering import sort_keys
from .pyramid import pool_pyramid
from .reference import reference_lighthouse_attention
from .scatter import scatter_back
from .scoring import dilated_scores, norm_scores, pyramid_scores, token_scores
from .selection import Selection, descend, select

__all__ = [
    "LighthouseAttention",
    "LighthouseConfig",
    "Selection",
    "causal_attention",
    "descend",
    "dilated_scores",
    "gather_subsequence",
    "lighthouse_attention",
    "norm_scores",
    "pool_pyramid",
    "pyramid_index",
    "pyramid_scores",
    "reference_lighthouse_attention",
    "scatter_back",
    "select",
    "sort_keys",
    "token_scores",
]
