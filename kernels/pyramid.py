"""Stages 1-2, fused: one pass over q, k, v that writes the pooled levels and the max-pooled norm scores.

Each program owns whole coarsest windows of one kv group: it reads the group's query heads, its key head
and its value head once, mean-pools them level by level in float32 (as `lighthouse.pyramid.pool_pyramid`),
and, for the norm scorer, takes per-token L2 norms (max over the group's query heads for sQ) and max-pools
them upward (as `lighthouse.scoring.pyramid_scores`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .launch import log2
from .ordering import static_level_offset


class Pyramid(NamedTuple):
    """Pooled levels 1..L-1 of q, k, v ([B, sum_{l>=1} N/p^l, heads, D], level 1 first) and the scores
    sq, sk (float32 [B, G, sum_{l>=0} N/p^l], level 0 first)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    sq: torch.Tensor
    sk: torch.Tensor


@triton.jit
def _pool_head(x_ptr, pyr_ptr, t0, b, h, N, NP, HX: tl.constexpr, D: tl.constexpr, L: tl.constexpr,
               LOG2P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Pool one head's [BLOCK_T, D] slab into levels 1..L-1; return its per-token sum of squares."""
    P: tl.constexpr = 1 << LOG2P
    t = tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    tmask = t0 + t < N
    x = tl.load(x_ptr + ((b * N + t0 + t)[:, None] * HX + h) * D + d[None, :],
                mask=tmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    cur = x
    for lvl in tl.static_range(1, L):
        cur = tl.sum(tl.reshape(cur, [BLOCK_T >> (lvl * LOG2P), P, BLOCK_D]), axis=1) * (1.0 / P)
        r = (t0 >> (lvl * LOG2P)) + tl.arange(0, BLOCK_T >> (lvl * LOG2P))
        out = pyr_ptr + ((b * NP + static_level_offset(lvl, N, LOG2P) - N + r)[:, None] * HX + h) * D
        tl.store(out + d[None, :], cur.to(pyr_ptr.dtype.element_ty),
                 mask=(r < (N >> (lvl * LOG2P)))[:, None] & dmask[None, :])
    return tl.sum(x * x, axis=1)


@triton.jit
def _store_score_pyramid(score_ptr, s, t0, N, L: tl.constexpr, LOG2P: tl.constexpr, BLOCK_T: tl.constexpr):
    """Store token scores `s` [BLOCK_T] and their max-pools at every level of one row."""
    P: tl.constexpr = 1 << LOG2P
    t = tl.arange(0, BLOCK_T)
    tl.store(score_ptr + t0 + t, s, mask=t0 + t < N)
    for lvl in tl.static_range(1, L):
        s = tl.max(tl.reshape(s, [BLOCK_T >> (lvl * LOG2P), P]), axis=1)
        r = (t0 >> (lvl * LOG2P)) + tl.arange(0, BLOCK_T >> (lvl * LOG2P))
        tl.store(score_ptr + static_level_offset(lvl, N, LOG2P) + r, s, mask=r < (N >> (lvl * LOG2P)))


@triton.jit
def _pool_score_kernel(q_ptr, k_ptr, v_ptr, qp_ptr, kp_ptr, vp_ptr, sq_ptr, sk_ptr, N, NP, NTOT,
                       H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, L: tl.constexpr,
                       LOG2P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                       SCORE: tl.constexpr):
    t0 = tl.program_id(0) * BLOCK_T
    bg = tl.program_id(1).to(tl.int64)
    b = bg // G
    g = bg % G
    REP: tl.constexpr = H // G
    ssq = tl.zeros([BLOCK_T], tl.float32)
    for r in tl.static_range(REP):
        ssq = tl.maximum(ssq, _pool_head(q_ptr, qp_ptr, t0, b, g * REP + r, N, NP, H, D, L, LOG2P,
                                         BLOCK_T, BLOCK_D))
    ssk = _pool_head(k_ptr, kp_ptr, t0, b, g, N, NP, G, D, L, LOG2P, BLOCK_T, BLOCK_D)
    _pool_head(v_ptr, vp_ptr, t0, b, g, N, NP, G, D, L, LOG2P, BLOCK_T, BLOCK_D)
    if SCORE:
        # sqrt is monotone and correctly rounded: max of norms == norm of the max sum of squares
        _store_score_pyramid(sq_ptr + bg * NTOT, tl.sqrt(ssq), t0, N, L, LOG2P, BLOCK_T)
        _store_score_pyramid(sk_ptr + bg * NTOT, tl.sqrt(ssk), t0, N, L, LOG2P, BLOCK_T)


def pool_and_score(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: int, levels: int,
                   scores: bool = True) -> Pyramid:
    """Pooled levels 1..L-1 of q, k, v and (if `scores`) the norm-score pyramids, in one pass.

    q [B, N, H, D], k, v [B, N, G, D], contiguous, N divisible by pool**(levels-1). Without `scores`,
    sq and sk are empty and the caller brings its own (the dilated scorer).
    """
    b, n, h, d = q.shape
    g = k.shape[2]
    np_ = sum(n // pool**lvl for lvl in range(1, levels))
    ntot = n + np_
    span = pool ** (levels - 1)
    block_d = triton.next_power_of_2(d)
    block_t = max(span, triton.next_power_of_2(max(1, 8192 // block_d)))
    qp = q.new_empty(b, np_, h, d)
    kp = k.new_empty(b, np_, g, d)
    vp = v.new_empty(b, np_, g, d)
    shape = (b, g, ntot) if scores else (0,)
    sq = torch.empty(shape, dtype=torch.float32, device=q.device)
    sk = torch.empty(shape, dtype=torch.float32, device=q.device)
    _pool_score_kernel[(triton.cdiv(n, block_t), b * g)](
        q, k, v, qp, kp, vp, sq, sk, n, np_, ntot, H=h, G=g, D=d, L=levels,
        LOG2P=log2(pool), BLOCK_T=block_t, BLOCK_D=block_d, SCORE=scores, num_warps=4,
    )
    return Pyramid(qp, kp, vp, sq, sk)
