"""Stages 3-4, fused: per-tile tree descent (SPEC section 3) and the gather order, one program per
(batch * kv-head, tile).

Descent: a program streams its tile's coarsest entries in blocks through two running top lists kept
sorted in registers by bitonic merges: the best m/2 by sQ and the best m by sK. The m/2 sK picks "among
the rest" are the best of the sK list outside the sQ picks (at most m/2 of the sK list can be sQ picks,
so the m best by sK always hold them). The p*m children of the m expanded entries are the next level's
candidates, ranked in one top-k each.

Order: SPEC section 4's sort key puts a leaf at its first token and an expanded entry right after its
last descendant, so a tile's gather order is a post-order walk of its selection tree, and an entry's
place follows from subtree sizes alone: counted bottom-up over the expanded entries, then prefix-summed
top-down. The program first sets its tile's part of the inverse map entry -> slot to -1, then writes
each entry's packed key (`lighthouse_kernels.ordering`) at its place and its place into the inverse map: no sort,
no fill and no second launch. While the walk runs, the inverse map holds each expanded entry's count of
descendants (as -2 - count) and a scratch row its expanded positions per level.

selection="strict" (SPEC section 3a) replaces the two rankings with an online rule, the same at every
level: walking the candidates in position order, a candidate is a record of a score if it beats each of the
W = 2K/m - 1 candidates before it (the first always is); the first m/2 sQ records are expanded, then the first
m/2 sK records among the rest, and once the candidates left are no more than the budget left, all of them.
Counts are prefix sums, carried from block to block over the coarsest entries; a finer level's p*m
candidates go through a scratch row so that each can read the W before it. Chosen positions are stored in
ascending order, so the next level's children come in position order too.

Scores become exact int64 keys: the float's bits made order-preserving in the high half, (2^31-1-pos)
in the low 31 bits, so larger key = higher score, then lower position. The prefix guarantee gives
entry 0 of each level the largest key of all in the sQ list.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .launch import launch, log2, next_power_of_2
from .ordering import packed_dtype, packed_key, static_level_offset

_POS_SCALE = tl.constexpr(2**31)  # positions take the low 31 bits of a key
_POS_MASK = tl.constexpr(2**31 - 1)
_NONE_KEY = tl.constexpr(-(2**63))  # a slot that holds no candidate
_FORCED_KEY = tl.constexpr(2**63 - 1)  # the prefix guarantee; its low bits decode to position 0
MAX_COARSE_BLOCK = 1024  # coarsest entries ranked per merge step


class GatherOrder(NamedTuple):
    """A row's gather order as packed keys [B, G, S] (`lighthouse_kernels.ordering`) and its inverse, the slot of
    every pyramid entry (int32 [B, G, sum_l N/p^l], -1 where not gathered)."""

    packed: torch.Tensor
    slots: torch.Tensor


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
def _level_keys(sq_row, sk_row, off, pos, valid, PREFIX: tl.constexpr):
    """(sQ keys, sK keys) of one level's entries `pos` (int64) starting at `off` in the score rows."""
    sq = tl.load(sq_row + off + pos, mask=valid, other=0.0)
    sk = tl.load(sk_row + off + pos, mask=valid, other=0.0)
    return _score_keys(sq, pos, valid, PREFIX), _score_keys(sk, pos, valid, False)


@triton.jit
def _top(x, R: tl.constexpr):
    """The R largest of x, sorted descending."""
    if R == 1:
        return tl.max(x, axis=0, keep_dims=True)
    else:
        return tl.topk(x, R)


@triton.jit
def _merge_top(run, block, R: tl.constexpr):
    """Best R of `run` (sorted descending) and `block` (any order, at least R), sorted descending."""
    top = _top(block, R)
    if R == 1:
        return tl.maximum(run, top)
    else:
        return tl.bitonic_merge(tl.maximum(run, tl.flip(top, 0)), descending=True)


@triton.jit
def _store_choice(run_q, run_k, sq_level, chosen, HALF: tl.constexpr, PREFIX: tl.constexpr):
    """Write the m expanded positions to `chosen`: the sQ picks `run_q`, then the best m/2 of `run_k`
    (sK keys, sorted descending) that are not sQ picks, found by their sQ keys (read at `sq_level`)."""
    tl.store(chosen + tl.arange(0, HALF), _key_pos(run_q))
    pos = _key_pos(run_k)
    valid = run_k != _NONE_KEY
    as_q = _score_keys(tl.load(sq_level + pos, mask=valid, other=0.0), pos.to(tl.int64), valid, PREFIX)
    rest = valid & (as_q < tl.min(run_q, axis=0))
    rank = tl.cumsum(rest.to(tl.int32), axis=0)
    tl.store(chosen + HALF + rank - 1, pos, mask=rest & (rank <= HALF))


@triton.jit
def _children(chosen, M: tl.constexpr, P: tl.constexpr):
    """The p*m children of the expanded positions at `chosen`, as [P, M] (int64): child c of parent j at [c, j]."""
    parent = tl.load(chosen + tl.arange(0, M)).to(tl.int64)
    return parent, parent[None, :] * P + tl.arange(0, P)[:, None]


@triton.jit
def _online_scores(sq_row, sk_row, pos, valid):
    """(sQ, sK) float32 at entries `pos` for the online rule: NaN counts as +inf, -inf where not `valid`."""
    inf = float("inf")
    sq = tl.load(sq_row + pos, mask=valid, other=-inf)
    sk = tl.load(sk_row + pos, mask=valid, other=-inf)
    return tl.where(sq != sq, inf, sq), tl.where(sk != sk, inf, sk)


@triton.jit
def _exclusive_cumsum(flags):
    counts = flags.to(tl.int32)
    return tl.cumsum(counts, axis=0) - counts


@triton.jit
def _online_choice(rec_q, rec_k, j, cands, counts, HALF: tl.constexpr, M: tl.constexpr):
    """Expanded mask of candidates `j` (tile order) from their records, and the counts (sQ records, sK records
    among the rest, picks) of the candidates before the block, updated past it."""
    n_q, n_k, n_picked = counts
    by_q = rec_q & (n_q + _exclusive_cumsum(rec_q) < HALF)
    rest_k = rec_k & ~by_q
    by_k = rest_k & (n_k + _exclusive_cumsum(rest_k) < HALF)
    picked = by_q | by_k
    fill = n_picked + _exclusive_cumsum(picked) + (cands - j) <= M
    counts = (n_q + tl.sum(rec_q.to(tl.int32), axis=0), n_k + tl.sum(rest_k.to(tl.int32), axis=0),
              n_picked + tl.sum(picked.to(tl.int32), axis=0))
    return picked | fill, counts


@triton.jit
def _store_chosen(chosen, pos, mask, done):
    """Store the positions `pos` where `mask` at `chosen` + `done` on, in order; return the count stored."""
    rank = done + _exclusive_cumsum(mask)
    tl.store(chosen + rank, pos.to(tl.int32), mask=mask)
    return done + tl.sum(mask.to(tl.int32), axis=0)


@triton.jit
def _online_coarsest(sq_level, sk_level, chosen, base, C, W, M: tl.constexpr, BLOCK_C: tl.constexpr):
    """selection="strict" at the coarsest level: the C entries from `base` are the candidates, BLOCK_C at a
    time; the m expanded ones are stored at `chosen` in ascending order."""
    lane = tl.arange(0, BLOCK_C)
    zero = C * 0
    counts = (zero, zero, zero)
    done = zero
    b0 = zero
    while b0 < C:
        j = b0 + lane
        valid = j < C
        sq, sk = _online_scores(sq_level, sk_level, base + j, valid)
        prev_q = tl.full([BLOCK_C], float("-inf"), tl.float32)
        prev_k = tl.full([BLOCK_C], float("-inf"), tl.float32)
        d = W * 0 + 1
        while d <= W:
            eq, ek = _online_scores(sq_level, sk_level, base + j - d, valid & (j >= d))
            prev_q = tl.maximum(prev_q, eq)
            prev_k = tl.maximum(prev_k, ek)
            d += 1
        rec_q = (sq > prev_q) | (j == 0)
        rec_k = (sk > prev_k) | (j == 0)
        expand, counts = _online_choice(rec_q & valid, rec_k & valid, j, C, counts, M // 2, M)
        done = _store_chosen(chosen, base + j, expand & valid, done)
        b0 += BLOCK_C


@triton.jit
def _online_level(sq_row, sk_row, chosen_tile, scratch, N, lvl: tl.constexpr, LOG2P: tl.constexpr,
                  M: tl.constexpr):
    """selection="strict" at level `lvl`: the p*m children of level lvl+1's expanded entries (stored in
    ascending order) are the candidates, in position order; each reads the W = 2p - 1 before it from
    `scratch` (2 * p * m floats)."""
    P: tl.constexpr = 1 << LOG2P
    K: tl.constexpr = P * M
    off = static_level_offset(lvl, N, LOG2P)
    parent = tl.load(chosen_tile + lvl * M + tl.arange(0, M)).to(tl.int64)
    pos = tl.reshape(parent[:, None] * P + tl.arange(0, P)[None, :], [K])
    j = tl.arange(0, K)
    sq, sk = _online_scores(sq_row + off, sk_row + off, pos, pos >= 0)
    tl.store(scratch + j, sq)
    tl.store(scratch + K + j, sk)
    tl.debug_barrier()
    prev_q = tl.full([K], float("-inf"), tl.float32)
    prev_k = tl.full([K], float("-inf"), tl.float32)
    for d in tl.static_range(1, 2 * P):
        earlier = j >= d
        prev_q = tl.maximum(prev_q, tl.load(scratch + j - d, mask=earlier, other=float("-inf")))
        prev_k = tl.maximum(prev_k, tl.load(scratch + K + j - d, mask=earlier, other=float("-inf")))
    zero = tl.sum(j, axis=0) * 0
    expand, _ = _online_choice((sq > prev_q) | (j == 0), (sk > prev_k) | (j == 0), j, K, (zero, zero, zero),
                               M // 2, M)
    _store_chosen(chosen_tile + (lvl - 1) * M, pos, expand, zero)


@triton.jit
def _descendants(slots_level, pos, valid):
    """Count of descendants of entries `pos` of one level (0 for a leaf), from the walk's marks."""
    mark = tl.load(slots_level + pos, mask=valid, other=-1)
    return tl.where(mark <= -2, -2 - mark, 0)


@triton.jit
def _place(out_row, slots_level, pos, start, below, first_slot, valid, lvl: tl.constexpr, L: tl.constexpr,
           LOG2P: tl.constexpr):
    """Write entries `pos` (subtrees starting at tile place `start`, with `below` descendants each) at their
    place in the gather order: a leaf first in its subtree, an expanded entry last."""
    place = start + below
    tl.store(out_row + first_slot + place, packed_key(pos, below > 0, lvl, L, LOG2P), mask=valid)
    tl.store(slots_level + pos, (first_slot + place).to(tl.int32), mask=valid)


@triton.jit
def _rank_coarsest(sq_level, sk_level, base, C, M: tl.constexpr, BLOCK_C: tl.constexpr, PREFIX: tl.constexpr):
    """(best m/2 sQ keys, best m sK keys), sorted descending, of the C coarsest entries from `base`, ranked
    BLOCK_C at a time."""
    lane = tl.arange(0, BLOCK_C)
    run_q = tl.full([M // 2], _NONE_KEY, tl.int64)
    run_k = tl.full([M], _NONE_KEY, tl.int64)
    # (while loops: the interpreter cannot run range() over a run-time bound with numpy >= 2.4)
    b0 = C * 0
    while b0 < C:
        valid = b0 + lane < C
        kq, kk = _level_keys(sq_level, sk_level, 0, base + b0 + lane, valid, PREFIX)
        run_q = _merge_top(run_q, kq, M // 2)
        run_k = _merge_top(run_k, kk, M)
        b0 += BLOCK_C
    return run_q, run_k


@triton.jit
def _place_coarsest(out_row, slots_level, base, C, first_slot, L: tl.constexpr, LOG2P: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    """Place the C coarsest entries from `base`: their subtrees follow one another, BLOCK_C at a time."""
    lane = tl.arange(0, BLOCK_C)
    done = C * 0
    b0 = C * 0
    while b0 < C:
        valid = b0 + lane < C
        pos = base + b0 + lane
        below = _descendants(slots_level, pos, valid)
        size = tl.where(valid, 1 + below, 0)
        _place(out_row, slots_level, pos, done + tl.cumsum(size, axis=0) - size, below, first_slot, valid,
               L - 1, L, LOG2P)
        done += tl.sum(size, axis=0)
        b0 += BLOCK_C


@triton.jit
def _clear_slots(slots_row, base, C, N, L: tl.constexpr, LOG2P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Set the inverse map of every entry under the C coarsest entries from `base` to -1 (not gathered), at
    every level: the walk's marks and places overwrite the gathered ones."""
    lane = tl.arange(0, BLOCK_C)
    for lvl in tl.static_range(L):
        count = C << ((L - 1 - lvl) * LOG2P)
        first = static_level_offset(lvl, N, LOG2P) + (base << ((L - 1 - lvl) * LOG2P))
        b0 = count * 0
        while b0 < count:
            tl.store(slots_row + first + b0 + lane, -1, mask=b0 + lane < count)
            b0 += BLOCK_C


@triton.jit
def _descend_level(sq_row, sk_row, chosen_tile, N, lvl: tl.constexpr, LOG2P: tl.constexpr, M: tl.constexpr,
                   PREFIX: tl.constexpr):
    """Choose level `lvl`'s m expanded entries among the p*m children of level lvl+1's."""
    P: tl.constexpr = 1 << LOG2P
    off = static_level_offset(lvl, N, LOG2P)
    _, pos = _children(chosen_tile + lvl * M, M, P)
    kq, kk = _level_keys(sq_row, sk_row, off, pos, pos >= 0, PREFIX)
    _store_choice(_top(tl.reshape(kq, [P * M]), M // 2), _top(tl.reshape(kk, [P * M]), M), sq_row + off,
                  chosen_tile + (lvl - 1) * M, M // 2, PREFIX)


@triton.jit
def _mark_level(slots_row, chosen_tile, N, lvl: tl.constexpr, LOG2P: tl.constexpr, M: tl.constexpr):
    """Mark level `lvl`'s expanded entries with their count of descendants (their children's are marked)."""
    P: tl.constexpr = 1 << LOG2P
    parent, pos = _children(chosen_tile + (lvl - 1) * M, M, P)
    below = tl.full([M], P, tl.int32)
    if lvl > 1:
        below += tl.sum(_descendants(slots_row + static_level_offset(lvl - 1, N, LOG2P), pos, pos >= 0), axis=0)
    tl.store(slots_row + static_level_offset(lvl, N, LOG2P) + parent, -2 - below)


@triton.jit
def _place_children(out_row, slots_row, chosen_tile, N, first_slot, lvl: tl.constexpr, L: tl.constexpr,
                    LOG2P: tl.constexpr, M: tl.constexpr):
    """Place level `lvl`'s candidates, the children of level lvl+1's expanded entries (already placed):
    each parent's children subtrees fill its subtree in order, the parent last."""
    P: tl.constexpr = 1 << LOG2P
    parent, pos = _children(chosen_tile + lvl * M, M, P)
    valid = pos >= 0
    below = tl.zeros([P, M], tl.int32)
    if lvl > 0:
        below = _descendants(slots_row + static_level_offset(lvl, N, LOG2P), pos, valid)
    size = 1 + below
    parent_place = tl.load(slots_row + static_level_offset(lvl + 1, N, LOG2P) + parent) - first_slot
    parent_start = parent_place - tl.sum(size, axis=0)
    _place(out_row, slots_row + static_level_offset(lvl, N, LOG2P), pos,
           parent_start[None, :] + tl.cumsum(size, axis=0) - size, below, first_slot, valid, lvl, L, LOG2P)


@triton.jit
def _select_tile_kernel(sq_ptr, sk_ptr, out_ptr, slots_ptr, chosen_ptr, scratch_ptr, N, NTOT, S, C, E_T, W,
                        L: tl.constexpr, LOG2P: tl.constexpr, M: tl.constexpr, BLOCK_C: tl.constexpr,
                        PREFIX: tl.constexpr, STRICT: tl.constexpr):
    TOP: tl.constexpr = L - 1
    tile = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    sq_row = sq_ptr + row * NTOT
    sk_row = sk_ptr + row * NTOT
    slots_row = slots_ptr + row * NTOT
    out_row = out_ptr + row * S
    chosen_tile = chosen_ptr + (row * tl.num_programs(0) + tile) * (L - 1) * M  # level l at (l-1)*M
    top_off = static_level_offset(TOP, N, LOG2P)
    base = tile.to(tl.int64) * C
    _clear_slots(slots_row, base, C, N, L, LOG2P, BLOCK_C)

    # descent, coarsest level: every entry of the tile is a candidate
    if STRICT:
        _online_coarsest(sq_row + top_off, sk_row + top_off, chosen_tile + (TOP - 1) * M, base, C, W, M, BLOCK_C)
    else:
        run_q, run_k = _rank_coarsest(sq_row + top_off, sk_row + top_off, base, C, M, BLOCK_C, PREFIX)
        _store_choice(run_q, run_k, sq_row + top_off, chosen_tile + (TOP - 1) * M, M // 2, PREFIX)

    # (each tl.debug_barrier below: the next phase reads what other threads of this program wrote to global
    # memory in the one before; a CTA barrier makes those writes visible)
    # descent, finer levels: the candidates are the p*m children of the m expanded entries
    for step in tl.static_range(L - 2):
        tl.debug_barrier()
        if STRICT:
            scratch = scratch_ptr + (row * tl.num_programs(0) + tile) * (2 * M << LOG2P)
            _online_level(sq_row, sk_row, chosen_tile, scratch, N, TOP - 1 - step, LOG2P, M)
        else:
            _descend_level(sq_row, sk_row, chosen_tile, N, TOP - 1 - step, LOG2P, M, PREFIX)

    # subtree sizes, bottom-up: mark each expanded entry with its count of descendants
    for lvl in tl.static_range(1, L):
        tl.debug_barrier()
        _mark_level(slots_row, chosen_tile, N, lvl, LOG2P, M)

    # places, top-down: prefix sums of subtree sizes
    first_slot = tile * E_T
    tl.debug_barrier()
    _place_coarsest(out_row, slots_row + top_off, base, C, first_slot, L, LOG2P, BLOCK_C)
    for step in tl.static_range(L - 1):
        tl.debug_barrier()
        _place_children(out_row, slots_row, chosen_tile, N, first_slot, TOP - 1 - step, L, LOG2P, M)


def select_order(sq: torch.Tensor, sk: torch.Tensor, seq_len: int, pool: int, levels: int, topk: int,
                 tile_budget: int, prefix: bool = True, key_dtype: torch.dtype | None = None,
                 coarse_block: int = MAX_COARSE_BLOCK, num_warps: int = 8, strict: bool = False) -> GatherOrder:
    """The gather order and its inverse map from score pyramids sq, sk (float32 [B, G, sum_l N/p^l], level
    0 first), in one launch. The geometry must be valid for `seq_len` (the caller's
    `LighthouseConfig.validate`) with levels >= 2: T = topk / tile_budget tiles, each with at least
    tile_budget coarsest entries. `prefix=False` drops the prefix guarantee (a sequence shard that does
    not hold token 0). Packed keys are `key_dtype`, by default int32 where every key of an N-token row
    fits (`lighthouse_kernels.ordering.packed_dtype`) else int64. `coarse_block`: coarsest entries ranked per merge
    step (a power of two; 1024 on 8 warps was the fastest on an H100 from N=8K to 512K). `strict`: the online
    rule of selection="strict" instead of the rankings (`prefix` then changes nothing: a tile's first candidate
    is always expanded)."""
    if sq.dtype != torch.float32 or sk.dtype != torch.float32:
        raise ValueError(f"the selection kernel takes float32 scores; got sq {sq.dtype}, sk {sk.dtype}")
    b, g, ntot = sq.shape
    tiles = topk // tile_budget
    coarse_per_tile = seq_len // pool ** (levels - 1) // tiles
    per_tile = coarse_per_tile + (levels - 1) * pool * tile_budget
    packed = torch.empty(b, g, tiles * per_tile, dtype=key_dtype or packed_dtype(seq_len, levels), device=sq.device)
    slots = torch.empty(b, g, ntot, dtype=torch.int32, device=sq.device)
    chosen = torch.empty(b * g * tiles * (levels - 1) * tile_budget, dtype=torch.int32, device=sq.device)
    scratch = torch.empty(b * g * tiles * 2 * pool * tile_budget if strict and levels > 2 else 1, dtype=torch.float32,
                          device=sq.device)
    block = max(tile_budget, min(next_power_of_2(coarse_per_tile), coarse_block))
    window = 2 * coarse_per_tile // tile_budget - 1  # the strict rule's, at the coarsest level
    launch(
        _select_tile_kernel, (tiles, b * g), sq.contiguous(), sk.contiguous(), packed, slots, chosen, scratch, seq_len,
        ntot, tiles * per_tile, coarse_per_tile, per_tile, window, L=levels, LOG2P=log2(pool), M=tile_budget,
        BLOCK_C=block, PREFIX=prefix, STRICT=strict, num_warps=num_warps,
    )
    return GatherOrder(packed, slots)
