"""The fused Lighthouse layer: Triton pyramid+scores, tile selection, gather, stock attention, scatter-back.

Same function as `lighthouse.reference_lighthouse_attention` (SPEC sections 1-5), same argument layout.
Differences from the reference are float rounding only: per-token norms and pooled means are summed in
another order, and gradients of a token are summed in float32 then cast once (the reference adds its
bf16 parts). The selection itself matches the reference index for index on the same scores.
"""
from __future__ import annotations

import torch

from lighthouse.attention import causal_attention
from lighthouse.config import LighthouseConfig
from lighthouse.layer import check_inputs
from lighthouse.scoring import pyramid_scores, token_scores

from .gather import gather_pyramid
from .ordering import slot_map
from .pyramid import Pyramid, pool_and_score
from .scatter import scatter_back
from .selection import select_packed

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_HEAD_DIM = 256
MAX_COARSEST_SPAN = 256  # the pooling kernel holds one coarsest window per head in registers


def supports(q: torch.Tensor, config: LighthouseConfig) -> bool:
    """Whether the fused path runs this call: CUDA tensors (or Triton's CPU interpreter), bf16/fp16/fp32,
    head dim <= 256 and a coarsest window p**(L-1) <= 256 tokens."""
    return (
        q.dtype in SUPPORTED_DTYPES
        and q.shape[-1] <= MAX_HEAD_DIM
        and config.coarsest_span <= MAX_COARSEST_SPAN
    )


def _score_pyramids(q, k, v, pyramid: Pyramid, config: LighthouseConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """sq, sk [B, G, sum_l N/p^l]: from the pooling pass (norm scorer) or the reference scorer (dilated)."""
    if config.scorer == "norm":
        return pyramid.sq, pyramid.sk
    return tuple(torch.cat(pyramid_scores(s, config.pool, config.levels), dim=-1)
                 for s in token_scores(q, k, v, config))


def fused_lighthouse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               config: LighthouseConfig, spill: bool = False) -> torch.Tensor:
    """Lighthouse attention on q [B, N, H, D], k/v [B, N, G, D] -> o [B, N, H, D] (q's dtype).

    Differentiable in q, k, v; no host synchronisation and static shapes (CUDA-graph and torch.compile
    friendly). `spill` keeps the p**(L-1)-1 positions past the end, as `lighthouse.scatter_back`.
    """
    check_inputs(q, k, v)
    n = q.shape[1]
    config.validate(n)
    if not supports(q, config):
        raise ValueError(
            f"the fused path needs dtype in {SUPPORTED_DTYPES}, head dim <= {MAX_HEAD_DIM} and "
            f"pool**(levels-1) <= {MAX_COARSEST_SPAN}; got dtype={q.dtype}, head dim={q.shape[-1]}, "
            f"pool**(levels-1)={config.coarsest_span}"
        )
    if config.levels == 1:
        return causal_attention(q, k, v, config.backend)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    with torch.no_grad():
        pyramid = pool_and_score(q, k, v, config.pool, config.levels, scores=config.scorer == "norm")
        sq, sk = _score_pyramids(q, k, v, pyramid, config)
    return attend_selected(q, k, v, pyramid, sq, sk, config, spill)


def attend_selected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pyramid: Pyramid, sq: torch.Tensor,
                    sk: torch.Tensor, config: LighthouseConfig, spill: bool = False) -> torch.Tensor:
    """Selection, gather, attention and scatter-back, given contiguous q, k, v, their pooled levels and the
    score pyramids sq, sk (float32 [B, G, sum_l N/p^l]); levels >= 2."""
    n, pool, levels = q.shape[1], config.pool, config.levels
    with torch.no_grad():
        packed = select_packed(sq, sk, n, config)
        slots = slot_map(packed, n, pool, levels)
    q_t, k_t, v_t = gather_pyramid(q, k, v, pyramid, packed, slots, pool, levels)
    o_t = causal_attention(q_t, k_t, v_t, config.backend)
    return scatter_back(o_t, packed, slots, n, pool, levels, spill)
