"""Stage 3, fused: per-tile tree descent (SPEC section 3), one program per (batch * kv-head, tile).

A program streams its tile's coarsest entries in blocks of m through two running top lists kept sorted in
registers by bitonic merges: the best m/2 by sQ and the best m by sK. The m/2 sK picks "among the rest"
are the best of the sK list outside the sQ picks (at most m/2 of the sK list can be sQ picks, so the m
best by sK always hold them). The m expanded entries' p*m children are the next level's candidates,
streamed the same way. Every candidate is written as a packed sort key (`kernels.ordering`), the tile's
entries in fixed slots, and a per-tile sort yields the gather order.

Scores become exact int64 keys: the float's bits made order-preserving in the high half, (2^31-1-pos)
in the low 31 bits, so larger key = higher score, then lower position. The prefix guarantee gives
entry 0 of each level the largest key of all in the sQ list.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import log2
from .ordering import packed_dtype, packed_key, sort_tiles, static_level_offset

_POS_SCALE = tl.constexpr(2**31)  # positions take the low 31 bits of a key
_POS_MASK = tl.constexpr(2**31 - 1)
_NONE_KEY = tl.constexpr(-(2**63))  # a slot that holds no candidate
_FORCED_KEY = tl.constexpr(2**63 - 1)  # the prefix guarantee; its low bits decode to position 0


@triton.jit
def _score_keys(score, pos, valid, FORCE: tl.constexpr):
    """Exact int64 keys of float32 `score` at level positions `pos` (int64)."""
    s = score + 0.0  # -0.0 ties with +0.0
    bits = s.to(tl.int32, bitcast=True)
    bits = tl.where(s != s, 0x7FC00000, bits)  # every NaN is one value, above +inf
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = ordered.to(tl.int64) * _POS_SCALE + (pos ^ _POS_MASK)  # == 2^31-1-pos
    if FORCE:
        key = tl.where(pos == 0, _FORCED_KEY, key)
    return tl.where(valid, key, _NONE_KEY)


@triton.jit
def _key_pos(key):
    return ((key & _POS_MASK) ^ _POS_MASK).to(tl.int32)


@triton.jit
def _top(x, R: tl.constexpr):
    """The R largest of x, sorted descending."""
    if R == 1:
        return tl.max(x, axis=0, keep_dims=True)
    else:
        return tl.topk(x, R)


@triton.jit
def _merge_top(run, block, R: tl.constexpr):
    """Best R of `run` (sorted descending) and `block` (any order), sorted descending: bitonic top-k."""
    top = _top(block, R)
    if R == 1:
        return tl.maximum(run, top)
    else:
        return tl.bitonic_merge(tl.maximum(run, tl.flip(top, 0)), descending=True)


@triton.jit
def _is_member(pos, chosen):
    return tl.max((pos[:, None] == chosen[None, :]).to(tl.int32), axis=1) > 0


@triton.jit
def _choose(run_q, run_k, HALF: tl.constexpr, M: tl.constexpr):
    """Positions of the m expanded entries: the sQ picks, then the best sK picks outside them."""
    pos_q = _key_pos(run_q)
    rest = tl.where(_is_member(_key_pos(run_k), pos_q), _NONE_KEY, run_k)
    pos_k = _key_pos(_top(rest, HALF))
    return tl.reshape(tl.join(pos_q, pos_k), [M])


@triton.jit
def _descend_children(sq_row, sk_row, out, parent, N, lvl: tl.constexpr, L: tl.constexpr, LOG2P: tl.constexpr,
                      M: tl.constexpr, PREFIX: tl.constexpr):
    """Expand m of the p*m children of `parent` (none at level 0), write all children's packed keys
    (child c of parent j at out[c*m + j]) and return the expanded positions."""
    P: tl.constexpr = 1 << LOG2P
    HALF: tl.constexpr = M // 2
    lane = tl.arange(0, M)
    chosen = parent.to(tl.int32)  # at level 0 nothing is expanded
    if lvl > 0:
        off = static_level_offset(lvl, N, LOG2P)
        run_q = tl.full([HALF], _NONE_KEY, tl.int64)
        run_k = tl.full([M], _NONE_KEY, tl.int64)
        for c in tl.static_range(P):
            pos = parent * P + c
            sq = tl.load(sq_row + off + pos)
            sk = tl.load(sk_row + off + pos)
            run_q = _merge_top(run_q, _score_keys(sq, pos, pos >= 0, PREFIX), HALF)
            run_k = _merge_top(run_k, _score_keys(sk, pos, pos >= 0, False), M)
        chosen = _choose(run_q, run_k, HALF, M)
    for c in tl.static_range(P):
        pos = parent * P + c
        if lvl > 0:
            expanded = _is_member(pos, chosen)
        else:
            expanded = pos < 0
        tl.store(out + c * M + lane, packed_key(pos, expanded, lvl, L, LOG2P))
    return chosen


@triton.jit
def _select_tile_kernel(sq_ptr, sk_ptr, out_ptr, N, NTOT, S, C, E_T, L: tl.constexpr,
                        LOG2P: tl.constexpr, M: tl.constexpr, PREFIX: tl.constexpr):
    P: tl.constexpr = 1 << LOG2P
    HALF: tl.constexpr = M // 2
    TOP: tl.constexpr = L - 1
    tile = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    sq_row = sq_ptr + row * NTOT
    sk_row = sk_ptr + row * NTOT
    out = out_ptr + row * S + tile * E_T
    lane = tl.arange(0, M)

    # coarsest level: every entry of the tile is a candidate
    off = static_level_offset(TOP, N, LOG2P)
    base = tile.to(tl.int64) * C
    run_q = tl.full([HALF], _NONE_KEY, tl.int64)
    run_k = tl.full([M], _NONE_KEY, tl.int64)
    # (while loops: the interpreter cannot run range() over a run-time bound with numpy >= 2.4)
    b0 = C * 0
    while b0 < C:
        valid = b0 + lane < C
        pos = base + b0 + lane
        sq = tl.load(sq_row + off + pos, mask=valid, other=0.0)
        sk = tl.load(sk_row + off + pos, mask=valid, other=0.0)
        run_q = _merge_top(run_q, _score_keys(sq, pos, valid, PREFIX), HALF)
        run_k = _merge_top(run_k, _score_keys(sk, pos, valid, False), M)
        b0 += M
    chosen = _choose(run_q, run_k, HALF, M)
    b0 = C * 0
    while b0 < C:
        valid = b0 + lane < C
        pos = base + b0 + lane
        tl.store(out + b0 + lane, packed_key(pos, _is_member(pos, chosen), TOP, L, LOG2P), mask=valid)
        b0 += M

    # finer levels: the candidates are the p*m children of the m expanded entries
    for step in tl.static_range(L - 1):
        chosen = _descend_children(sq_row, sk_row, out + C + step * P * M, chosen.to(tl.int64), N,
                                   L - 2 - step, L, LOG2P, M, PREFIX)


def select_packed(sq: torch.Tensor, sk: torch.Tensor, seq_len: int, pool: int, levels: int, topk: int,
                  tile_budget: int, prefix: bool = True) -> torch.Tensor:
    """Gather order as packed keys (`kernels.ordering`) [B, G, S], int32 where every key of an N-token row
    fits (`kernels.ordering.packed_dtype`; half the bytes to sort) else int64, from score pyramids sq, sk
    (float32 [B, G, sum_l N/p^l], level 0 first). The geometry must be valid for `seq_len` (the caller's
    `LighthouseConfig.validate`) with levels >= 2: T = topk / tile_budget tiles, each with at least
    tile_budget coarsest entries. `prefix=False` drops the prefix guarantee (a sequence shard that does
    not hold token 0). Eight warps per program: the kernel is latency-bound (few programs), and on an H100
    8 warps took 60 us at N=32K where 4 took 84."""
    if sq.dtype != torch.float32 or sk.dtype != torch.float32:
        raise ValueError(f"the selection kernel takes float32 scores; got sq {sq.dtype}, sk {sk.dtype}")
    b, g, ntot = sq.shape
    tiles = topk // tile_budget
    coarse_per_tile = seq_len // pool ** (levels - 1) // tiles
    per_tile = coarse_per_tile + (levels - 1) * pool * tile_budget
    packed = torch.empty(b, g, tiles * per_tile, dtype=packed_dtype(seq_len, levels), device=sq.device)
    _select_tile_kernel[(tiles, b * g)](
        sq.contiguous(), sk.contiguous(), packed, seq_len, ntot, tiles * per_tile, coarse_per_tile, per_tile,
        L=levels, LOG2P=log2(pool), M=tile_budget, PREFIX=prefix, num_warps=8,
    )
    return sort_tiles(packed, tiles)
