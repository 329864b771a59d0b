"""Stages 1-2, fused: one pass over q, k, v that writes the pooled levels and the max-pooled norm scores,
and (selection="causal") a pass that turns level-0 scores into trailing-window scores.

Only the pooled levels worth keeping are written (`stored_levels`): the coarsest is gathered whole, but of
an intermediate level only p*k entries per row are gathered, and the gather recomputes those from the
tokens when that reads no more than writing the level would (at N=512K, k=2048, L=3, p=4 this saves a
fifth of the pass's bytes).

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

from .launch import cdiv, every_row, launch, load_windows, log2, next_power_of_2
from .ordering import static_level_offset, static_stored_offset


MAX_RECOMPUTED_SPAN = 16  # the gather sums at most this many tokens per recomputed entry (unrolled)


class Pyramid(NamedTuple):
    """The stored pooled levels of q, k, v ([B, sum over stored l of N/p^l, heads, D], lowest first), the
    scores sq, sk (float32 [B, G, sum_{l>=0} N/p^l], level 0 first), and `stored`, the bitmask of the
    pooled levels kept (bit l: level l)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    sq: torch.Tensor
    sk: torch.Tensor
    stored: int


def stored_levels(seq_len: int, pool: int, levels: int, gathered: int | None = None) -> int:
    """Bitmask of the pooled levels to keep in memory, for `gathered` entries of each intermediate level
    per row (p * topk; None: keep every level). The coarsest is always kept; an intermediate level l is
    recomputed by the gather when its gathered entries hold no more tokens (gathered * p**l) than the level
    has entries (N / p**l), and p**l <= MAX_RECOMPUTED_SPAN. At equality (k = N/64 with L=3, p=4) recomputing
    won on an H100: pooling + gather 155 -> 134 us at N=32K, 2183 -> 1768 us at 512K."""
    mask = 1 << (levels - 1)
    for lvl in range(1, levels - 1):
        span = pool**lvl
        if gathered is None or span > MAX_RECOMPUTED_SPAN or gathered * span > seq_len // span:
            mask |= 1 << lvl
    return mask


def pyramid_entries(seq_len: int, pool: int, levels: int) -> int:
    """Entries of all levels of a `seq_len`-token row, level 0 included: the length of a score row."""
    return sum(seq_len // pool**lvl for lvl in range(levels))


def stored_rows(seq_len: int, pool: int, levels: int, stored: int) -> int:
    """Rows per batch row of the stored pooled levels (bitmask `stored`) of a `seq_len`-token row."""
    return sum(seq_len // pool**lvl for lvl in range(1, levels) if stored >> lvl & 1)


@triton.jit
def _pool_head(x_ptr, pyr_ptr, t0, b, h, N, NP, HX: tl.constexpr, D: tl.constexpr, L: tl.constexpr,
               LOG2P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, STORED: tl.constexpr,
               SCORE: tl.constexpr):
    """Write one head's means of tokens [t0, t0 + BLOCK_T) at every stored level; return each token's sum
    of squares, [BLOCK_T] (zeros without SCORE)."""
    ss = tl.zeros([BLOCK_T], tl.float32)
    if SCORE:
        x = load_windows(x_ptr, t0, b, h, N, every_row(BLOCK_T), HX, D, BLOCK_T, 1, BLOCK_D)
        ss = tl.sum(tl.sum(x * x, axis=2), axis=1)
    d = tl.arange(0, BLOCK_D)
    for lvl in tl.static_range(1, L):
        if (STORED >> lvl) & 1:
            x = load_windows(x_ptr, t0, b, h, N, every_row(BLOCK_T >> (lvl * LOG2P)), HX, D, BLOCK_T >> (lvl * LOG2P),
                             1 << (lvl * LOG2P), BLOCK_D)
            r = (t0 >> (lvl * LOG2P)) + tl.arange(0, BLOCK_T >> (lvl * LOG2P))
            out = pyr_ptr + ((b * NP + static_stored_offset(lvl, N, LOG2P, STORED) + r)[:, None] * HX + h) * D
            mean = tl.sum(x, axis=1) * (1.0 / (1 << (lvl * LOG2P)))
            tl.store(out + d[None, :], mean.to(pyr_ptr.dtype.element_ty),
                     mask=(r < (N >> (lvl * LOG2P)))[:, None] & (d < D)[None, :])
    return ss


@triton.jit
def _store_window_norms(ss, s_row, t0, N, LOG2P: tl.constexpr, BLOCK_T: tl.constexpr, lvl: tl.constexpr):
    """Store the largest per-token norm of each level-`lvl` window of the tokens' sums of squares `ss`
    (sqrt is monotone and correctly rounded: the max of norms is the norm of the max sum of squares)."""
    i = (t0 >> (lvl * LOG2P)) + tl.arange(0, BLOCK_T >> (lvl * LOG2P))
    window_max = tl.max(tl.reshape(ss, [BLOCK_T >> (lvl * LOG2P), 1 << (lvl * LOG2P)]), axis=1)
    tl.store(s_row + static_level_offset(lvl, N, LOG2P) + i, tl.sqrt(window_max), mask=i < (N >> (lvl * LOG2P)))


@triton.jit
def _pool_score_kernel(q_ptr, k_ptr, v_ptr, qp_ptr, kp_ptr, vp_ptr, sq_ptr, sk_ptr, N, NP, NTOT,
                       H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, L: tl.constexpr,
                       LOG2P: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                       SCORE: tl.constexpr, STORED: tl.constexpr):
    """The stored levels of the group's query heads, key head and value head, and (SCORE) every level's
    sQ (max over the group's query heads) and sK, from the tokens' sums of squares."""
    t0 = tl.program_id(0) * BLOCK_T
    bg = tl.program_id(1).to(tl.int64)
    b = bg // G
    g = bg % G
    REP: tl.constexpr = H // G
    ssq = tl.zeros([BLOCK_T], tl.float32)
    for r in tl.static_range(REP):
        ssq = tl.maximum(ssq, _pool_head(q_ptr, qp_ptr, t0, b, g * REP + r, N, NP, H, D, L, LOG2P, BLOCK_T,
                                         BLOCK_D, STORED, SCORE))
    ssk = _pool_head(k_ptr, kp_ptr, t0, b, g, N, NP, G, D, L, LOG2P, BLOCK_T, BLOCK_D, STORED, SCORE)
    _pool_head(v_ptr, vp_ptr, t0, b, g, N, NP, G, D, L, LOG2P, BLOCK_T, BLOCK_D, STORED, False)
    if SCORE:
        for lvl in tl.static_range(L):
            _store_window_norms(ssq, sq_ptr + bg * NTOT, t0, N, LOG2P, BLOCK_T, lvl)
            _store_window_norms(ssk, sk_ptr + bg * NTOT, t0, N, LOG2P, BLOCK_T, lvl)


def pool_and_score(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: int, levels: int,
                   scores: bool = True, stored: int | None = None, tokens_per_program: int = 64,
                   num_warps: int | None = None) -> Pyramid:
    """The stored pooled levels of q, k, v and (if `scores`) the norm-score pyramids, in one pass.

    q [B, N, H, D], k, v [B, N, G, D], contiguous, N divisible by pool**(levels-1). Without `scores`,
    sq and sk are empty and the caller brings its own (the dilated scorer). `stored`: bitmask of the pooled
    levels to write (`stored_levels`; None: all). A program covers at least `tokens_per_program` tokens
    (rounded up to whole coarsest windows) with `num_warps` warps (None: one per 32 tokens, at least 2;
    64 tokens on 2 warps ran at 94% of copy bandwidth on an H100 at N=512K, against 71% on 4 warps).
    """
    b, n, h, d = q.shape
    g = k.shape[2]
    stored = stored_levels(n, pool, levels) if stored is None else stored
    if stored & 1 or stored >> levels or not stored >> (levels - 1) & 1:
        raise ValueError(f"stored={stored:#b} must keep the coarsest level {levels - 1} and only levels "
                         f"1..{levels - 1}")
    np_ = stored_rows(n, pool, levels, stored)
    ntot = pyramid_entries(n, pool, levels)
    span = pool ** (levels - 1)
    block_d = next_power_of_2(d)
    block_t = max(span, next_power_of_2(tokens_per_program))
    num_warps = num_warps or max(2, block_t // 32)
    qp = q.new_empty(b, np_, h, d)
    kp = k.new_empty(b, np_, g, d)
    vp = v.new_empty(b, np_, g, d)
    shape = (b, g, ntot) if scores else (0,)
    sq = torch.empty(shape, dtype=torch.float32, device=q.device)
    sk = torch.empty(shape, dtype=torch.float32, device=q.device)
    launch(
        _pool_score_kernel, (cdiv(n, block_t), b * g), q, k, v, qp, kp, vp, sq, sk, n, np_, ntot, H=h, G=g, D=d,
        L=levels, LOG2P=log2(pool), BLOCK_T=block_t, BLOCK_D=block_d, SCORE=scores, STORED=stored, num_warps=num_warps,
    )
    return Pyramid(qp, kp, vp, sq, sk, stored)


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
                raise ValueError(f"history{tuple(h.shape)} must be [R, G, pool**(levels-1) - 1] = "
                                 f"{(rows, groups, halo)}")
        history = tuple(h.contiguous() for h in history)
    block_t = max(pool ** (levels - 1), next_power_of_2(tokens_per_program))
    hq, hk = history if history is not None else (sq, sk)
    launch(
        _causal_levels_kernel, (cdiv(seq_len, block_t), rows * groups), sq, sk, hq, hk, seq_len, ntot, L=levels,
        LOG2P=log2(pool), HALO=halo, HISTORY=history is not None,
        BLOCK_T=block_t, num_warps=4,
    )
    return sq, sk
