"""Stage 1: symmetric mean pooling of q, k, v into an L-level pyramid (SPEC section 1)."""
from __future__ import annotations

import torch


def pool_pyramid(x: torch.Tensor, pool: int, levels: int) -> list[torch.Tensor]:
    """Mean-pool `x [B, N, H, D]` into levels 0..L-1, level l of shape [B, N / pool**l, H, D].

    Each level pools the previous one by `pool`; windows are equal-sized, so this equals the mean over
    the level's whole base window. Accumulates in float32 (float64 stays float64) and returns x's dtype.
    Differentiable: pooling is the only path by which gradient reaches unselected tokens.
    """
    acc_dtype = torch.promote_types(x.dtype, torch.float32)
    b, n, h, d = x.shape
    out = [x]
    cur = x
    for lvl in range(1, levels):
        cur = cur.reshape(b, n // pool**lvl, pool, h, d).mean(dim=2, dtype=acc_dtype)
        out.append(cur.to(x.dtype))
    return out


def level_offsets(seq_len: int, pool: int, levels: int) -> list[int]:
    """Start of each level in the concatenation of all levels along the sequence axis."""
    offsets, total = [], 0
    for lvl in range(levels):
        offsets.append(total)
        total += seq_len // pool**lvl
    return offsets
