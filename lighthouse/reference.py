"""The pure-PyTorch pipeline of SPEC sections 1-5, stage by stage; every fast path is tested against it."""
from __future__ import annotations

import torch

from .attention import causal_attention
from .config import LighthouseConfig
from .gather import gather_subsequence, pyramid_index
from .pyramid import pool_pyramid
from .scatter import scatter_back
from .selection import select


def reference_lighthouse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig
) -> torch.Tensor:
    """pyramid -> scores -> selection -> order -> gather -> SDPA -> scatter-back on q [B, N, H, D],
    k/v [B, N, G, D] -> o [B, N, H, D]."""
    n, pool, levels = q.shape[1], config.pool, config.levels
    flat_index = pyramid_index(select(q, k, config, v=v), n, pool, levels)
    q_t, k_t, v_t = (gather_subsequence(pool_pyramid(x, pool, levels), flat_index) for x in (q, k, v))
    o_t = causal_attention(q_t, k_t, v_t, config.backend)
    return scatter_back(o_t, flat_index, n, pool, levels)
