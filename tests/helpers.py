"""Shared test inputs: fresh random q, k, v of a given geometry."""
from __future__ import annotations

import torch


def random_qkv(
    batch: int, seq_len: int, heads: int, kv_heads: int, dim: int, dtype=torch.float64, requires_grad=False, seed=None
):
    """Fresh standard-normal q [B,N,H,D], k, v [B,N,G,D] (a new seed every call unless one is given)."""
    gen = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(0, 2**31, ()).item()))
    q = torch.randn(batch, seq_len, heads, dim, generator=gen, dtype=dtype)
    k = torch.randn(batch, seq_len, kv_heads, dim, generator=gen, dtype=dtype)
    v = torch.randn(batch, seq_len, kv_heads, dim, generator=gen, dtype=dtype)
    return tuple(x.requires_grad_(requires_grad) for x in (q, k, v))


def vectors_with_norms(norms: torch.Tensor, dim: int) -> torch.Tensor:
    """Random directions [..., dim] whose L2 norms are exactly-ish `norms` (float64)."""
    x = torch.randn(*norms.shape, dim, dtype=torch.float64)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True) * norms.unsqueeze(-1)
