"""The Lighthouse layer: pyramid -> scores -> selection -> order -> gather -> SDPA -> scatter-back."""
from __future__ import annotations

import os

import torch
from torch import nn

from .attention import causal_attention
from .config import LighthouseConfig
from .gather import gather_subsequence, pyramid_index
from .pyramid import pool_pyramid
from .scatter import scatter_back
from .selection import select


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError naming the shapes, dtypes or devices if q [B,N,H,D], k/v [B,N,G,D] don't fit together."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, N, heads, D]; got q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k{tuple(k.shape)} and v{tuple(v.shape)} must have the same shape")
    (b, n, h, d), (bk, nk, g, dk) = q.shape, k.shape
    if (b, n, d) != (bk, nk, dk):
        raise ValueError(f"q{tuple(q.shape)} and k{tuple(k.shape)} must agree on batch, sequence and head dim")
    if h % g != 0:
        raise ValueError(f"query heads H={h} must be a multiple of kv heads G={g}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")


def reference_lighthouse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig
) -> torch.Tensor:
    """The pure-PyTorch pipeline of SPEC sections 1-5; every fast path is tested against it."""
    n, pool, levels = q.shape[1], config.pool, config.levels
    flat_index = pyramid_index(select(q, k, config, v=v), n, pool, levels)
    q_t, k_t, v_t = (gather_subsequence(pool_pyramid(x, pool, levels), flat_index) for x in (q, k, v))
    o_t = causal_attention(q_t, k_t, v_t, config.backend)
    return scatter_back(o_t, flat_index, n, pool, levels)


FORCE_REFERENCE_ENV = "LIGHTHOUSE_FORCE_REFERENCE"


def uses_fused_kernels(q: torch.Tensor, config: LighthouseConfig) -> bool:
    """The fused Triton path runs on CUDA inputs it supports, unless `backend="reference"` or the
    environment sets LIGHTHOUSE_FORCE_REFERENCE=1 (both force the pure-PyTorch pipeline, for debugging)."""
    if not q.is_cuda or config.backend == "reference" or os.environ.get(FORCE_REFERENCE_ENV) == "1":
        return False
    from kernels import supports  # Triton is imported only where the kernels can run

    return supports(q, config)


def lighthouse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig) -> torch.Tensor:
    """Lighthouse attention on q [B, N, H, D], k/v [B, N, G, D] (after RoPE) -> o [B, N, H, D] in q's dtype.

    On CUDA this runs the fused kernels (`kernels.fused_lighthouse_attention`), elsewhere the reference.
    """
    check_inputs(q, k, v)
    config.validate(q.shape[1])
    if uses_fused_kernels(q, config):
        from kernels import fused_lighthouse_attention

        return fused_lighthouse_attention(q, k, v, config)
    return reference_lighthouse_attention(q, k, v, config)


class LighthouseAttention(nn.Module):
    """Drop-in replacement for causal SDPA inside a model: forward(q, k, v) with [B, N, heads, D] layout."""

    def __init__(self, config: LighthouseConfig) -> None:
        super().__init__()
        config.check()
        self.config = config

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return lighthouse_attention(q, k, v, self.config)

    def extra_repr(self) -> str:
        c = self.config
        return f"levels={c.levels}, pool={c.pool}, topk={c.topk}, tile_budget={c.tile_budget}, scorer={c.scorer}"
