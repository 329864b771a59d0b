"""Stages 1-2, fused: one pass over q, k, v that writes the pooled levels and the max-pooled norm scores,
and (selection="causal") a pass that turns level-0 scores into trailing-window scores.

Each program owns whole coarsest windows of one kv group: it reads the group's query heads, its key head
and its value head from memory once, takes each level's window means in float32 (level l is the mean of
its p**l tokens, as `lighthouse.pyramid.pool_pyramid` up to float32 summation order), and, for the norm
scorer, the largest per-token L2 norm of each window (max over the group's query heads for sQ), which is
`lighthouse.scoring.pyramid_scores` of the token norms.
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
def _load_windows(x_ptr, t0, b, h, N, HX: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                  SPAN: tl.constexpr, BLOCK_D: tl.constexpr):
    """Tokens [t0, t0 + ROWS*SPAN) of head h as float32 [ROWS, SPAN, BLOCK_D]: one pooling window per row.

    Loading each level's windows as their own axis keeps every reduction inside registers and warps
    (reshaping one tile level by level costs shared-memory round trips); the re-reads hit the cache.
    """
    r = tl.arange(0, ROWS)[:, None, None]
    c = tl.arange(0, SPAN)[None, :, None]
    d = tl.arange(0, BLOCK_D)[None, None, :]
    t = t0 + r * SPAN + c
    return tl.load(x_ptr + ((b * N + t) * HX + h) * D + d, mask=(t < N) & (d < D), other=0.0).to(tl.float32)


@triton.jit
def _pool_head(x_ptr, pyr_ptr, t0, b, h, N, NP, HX: tl.constexpr, D: tl.constexpr, L: tl.constexpr,
               LOG2P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, lvl: tl.constexpr):
    """Write one head's level-`lvl` means of tokens [t0, t0 + BLOCK_T); return each window's largest
    per-token sum of squares, [BLOCK_T / p**lvl] (level 0: every token's)."""
    x = _load_windows(x_ptr, t0, b, h, N, HX, D, BLOCK_T >> (lvl * LOG2P), 1 << (lvl * LOG2P), BLOCK_D)
    if lvl > 0:
        r = (t0 >> (lvl * LOG2P)) + tl.arange(0, BLOCK_T >> (lvl * LOG2P))
        d = tl.arange(0, BLOCK_D)
        out = pyr_ptr + ((b * NP + static_level_offset(lvl, N, LOG2P) - N + r)[:, None] * HX + h) * D + d[None, :]
        mean = tl.sum(x, axis=1) * (1.0 / (1 << (lvl * LOG2P)))
        tl.store(out, mean.to(pyr_ptr.dtype.element_ty), mask=(r < (N >> (lvl * LOG2P)))[:, None] & (d < D)[None, :])
    return tl.max(tl.sum(x * x, axis=2), axis=1)


@triton.jit
def _pool_level(q_ptr, k_ptr, v_ptr, qp_ptr, kp_ptr, vp_ptr, sq_row, sk_row, t0, b, g, N, NP,
                H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, L: tl.constexpr, LOG2P: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, SCORE: tl.constexpr, lvl: tl.constexpr):
    """Level `lvl` of the group's query heads, key head and value head, and (SCORE) its sQ, sK."""
    REP: tl.constexpr = H // G
    ssq = tl.zeros([BLOCK_T >> (lvl * LOG2P)], tl.float32)
    for r in tl.static_range(REP):
        ssq = tl.maximum(ssq, _pool_head(q_ptr, qp_ptr, t0, b, g * REP + r, N, NP, H, D, L, LOG2P, BLOCK_T,
                                         BLOCK_D, lvl))
    ssk = _pool_head(k_ptr, kp_ptr, t0, b, g, N, NP, G, D, L, LOG2P, BLOCK_T, BLOCK_D, lvl)
    if lvl > 0:
        _pool_head(v_ptr, vp_ptr, t0, b, g, N, NP, G, D, L, LOG2P, BLOCK_T, BLOCK_D, lvl)
    if SCORE:
        # sqrt is monotone and correctly rounded: the max of norms is the norm of the max sum of squares
        i = (t0 >> (lvl * LOG2P)) + tl.arange(0, BLOCK_T >> (lvl * LOG2P))
        off = static_level_offset(lvl, N, LOG2P)
        valid = i < (N >> (lvl * LOG2P))
        tl.store(sq_row + off + i, tl.sqrt(ssq), mask=valid)
        tl.store(sk_row + off + i, tl.sqrt(ssk), mask=valid)


@triton.jit
def _pool_score_kernel(q_ptr, k_ptr, v_ptr, qp_ptr, kp_ptr, vp_ptr, sq_ptr, sk_ptr, N, NP, NTOT,
                       H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, L: tl.constexpr,
                       LOG2P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                       SCORE: tl.constexpr):
    t0 = tl.program_id(0) * BLOCK_T
    bg = tl.program_id(1).to(tl.int64)
    b = bg // G
    g = bg % G
    for lvl in tl.static_range(L):
        if SCORE or lvl > 0:
            _pool_level(q_ptr, k_ptr, v_ptr, qp_ptr, kp_ptr, vp_ptr, sq_ptr + bg * NTOT, sk_ptr + bg * NTOT, t0, b, g,
                        N, NP, H, G, D, L, LOG2P, BLOCK_T, BLOCK_D, SCORE, lvl)


def pool_and_score(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: int, levels: int,
                   scores: bool = True, tokens_per_program: int = 64, num_warps: int = 4) -> Pyramid:
    """Pooled levels 1..L-1 of q, k, v and (if `scores`) the norm-score pyramids, in one pass.

    q [B, N, H, D], k, v [B, N, G, D], contiguous, N divisible by pool**(levels-1). Without `scores`,
    sq and sk are empty and the caller brings its own (the dilated scorer). A program covers at least
    `tokens_per_program` tokens (rounded up to whole coarsest windows).
    """
    b, n, h, d = q.shape
    g = k.shape[2]
    np_ = sum(n // pool**lvl for lvl in range(1, levels))
    ntot = n + np_
    span = pool ** (levels - 1)
    block_d = triton.next_power_of_2(d)
    block_t = max(span, triton.next_power_of_2(tokens_per_program))
    qp = q.new_empty(b, np_, h, d)
    kp = k.new_empty(b, np_, g, d)
    vp = v.new_empty(b, np_, g, d)
    shape = (b, g, ntot) if scores else (0,)
    sq = torch.empty(shape, dtype=torch.float32, device=q.device)
    sk = torch.empty(shape, dtype=torch.float32, device=q.device)
    _pool_score_kernel[(triton.cdiv(n, block_t), b * g)](
        q, k, v, qp, kp, vp, sq, sk, n, np_, ntot, H=h, G=g, D=d, L=levels,
        LOG2P=log2(pool), BLOCK_T=block_t, BLOCK_D=block_d, SCORE=scores, num_warps=num_warps,
    )
    return Pyramid(qp, kp, vp, sq, sk)


@triton.jit
def _trailing_max(s_row, h_row, t, valid, out, HISTORY: tl.constexpr):
    """Store at `out` the max of one row's level-0 scores over each row of token positions `t` (negative
    positions read the row's history, or are skipped)."""
    x = tl.load(s_row + t, mask=(t >= 0) & valid[:, None], other=float("-inf"))
    if HISTORY:
        x = tl.maximum(x, tl.load(h_row + t, mask=(t < 0) & valid[:, None], other=float("-inf")))
    tl.store(out, tl.max(x, axis=1), mask=valid)


@triton.jit
def _causal_levels_kernel(sq_ptr, sk_ptr, hq_ptr, hk_ptr, N, NTOT, L: tl.constexpr, LOG2P: tl.constexpr,
                          HALO: tl.constexpr, HISTORY: tl.constexpr, BLOCK_T: tl.constexpr):
    """Levels 1..L-1 of one row's causal sQ and sK from their level 0: entry i of level l (span c, first token
    s = i*c) gets the max over tokens [s - c + 1, s], tokens < 0 read from the row's history (or skipped).
    A program writes the entries whose first token lies in its BLOCK_T tokens."""
    row = tl.program_id(1).to(tl.int64)
    t0 = tl.program_id(0) * BLOCK_T
    for lvl in tl.static_range(1, L):
        # the level's span p**lvl is written out (a constexpr cannot be reassigned across unrolled levels)
        i = (t0 >> (lvl * LOG2P)) + tl.arange(0, BLOCK_T >> (lvl * LOG2P))
        valid = i < (N >> (lvl * LOG2P))
        t = ((i << (lvl * LOG2P)) - (1 << (lvl * LOG2P)) + 1)[:, None] + tl.arange(0, 1 << (lvl * LOG2P))[None, :]
        out = row * NTOT + static_level_offset(lvl, N, LOG2P) + i
        _trailing_max(sq_ptr + row * NTOT, hq_ptr + row * HALO + HALO, t, valid, sq_ptr + out, HISTORY)
        _trailing_max(sk_ptr + row * NTOT, hk_ptr + row * HALO + HALO, t, valid, sk_ptr + out, HISTORY)


def causal_score_levels(sq: torch.Tensor, sk: torch.Tensor, seq_len: int, pool: int, levels: int,
                        history: tuple[torch.Tensor, torch.Tensor] | None = None,
                        tokens_per_program: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewrite levels 1..L-1 of the score pyramids sq, sk (float32 [R, G, sum_l N/p^l], level 0 first,
    contiguous) in place as `lighthouse.pyramid_scores(..., selection="causal")` of their level 0, in one
    launch, and return them.

    `history` (float32 [R, G, p**(L-1) - 1] each, for sq and sk) holds each row's level-0 scores of the
    tokens right before it (a sequence shard that does not start at token 0); None: every row starts the
    sequence. Maxima are exact, so this equals the reference bit for bit.
    """
    rows, groups, ntot = sq.shape
    halo = pool ** (levels - 1) - 1
    if history is not None:
        for h in history:
            if h.shape != (rows, groups, halo):
                raise ValueError(f"history{tuple(h.shape)} must be [R, G, pool**(levels-1) - 1] = {(rows, groups, halo)}")
        history = tuple(h.contiguous() for h in history)
    block_t = max(pool ** (levels - 1), triton.next_power_of_2(tokens_per_program))
    hq, hk = history if history is not None else (sq, sk)
    _causal_levels_kernel[(triton.cdiv(seq_len, block_t), rows * groups)](
        sq, sk, hq, hk, seq_len, ntot, L=levels, LOG2P=log2(pool), HALO=halo, HISTORY=history is not None,
        BLOCK_T=block_t, num_warps=4,
    )
    return sq, sk
