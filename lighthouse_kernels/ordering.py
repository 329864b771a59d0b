"""Stage 4, fused: packed sort keys and level offsets (the selection kernel writes the gather order).

A gathered entry travels as one integer, `packed = key * L + level` (int32 where every value of the row
fits, else int64: `packed_dtype`), where `key` is SPEC section 4's exact
sort key (leaf: start*(L+1); expanded: end*(L+1) + level). Keys are unique within a row, so ordering the
packed values orders by key, and (level, index) decode from the value alone.

Tiles are contiguous in token space and every entry of a tile lies inside the tile's tokens, so a row's
gather order is its tiles' orders laid end to end.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def packed_dtype(seq_len: int, levels: int) -> torch.dtype:
    """int32 where every packed key of a `seq_len`-token row fits (key < N*(L+1), packed < N*(L+1)*L), else
    int64: half the bytes to write and read."""
    return torch.int32 if seq_len * (levels + 1) * levels < 2**31 else torch.int64


@triton.jit
def packed_key(pos, expanded, lvl: tl.constexpr, L: tl.constexpr, LOG2P: tl.constexpr):
    """Packed key of level-`lvl` entries `pos` (int64): leaves sort at their start, expanded at their end."""
    span: tl.constexpr = 1 << (lvl * LOG2P)
    leaf_key = pos * span * (L + 1)
    expanded_key = ((pos + 1) * span - 1) * (L + 1) + lvl
    return tl.where(expanded, expanded_key, leaf_key) * L + lvl


@triton.jit
def decode_entry(packed, L: tl.constexpr, LOG2P: tl.constexpr):
    """(level, index, span) of packed keys; index is the entry's position within its level."""
    lvl = packed % L
    key = packed // L
    span = tl.full(lvl.shape, 1, tl.int64) << (lvl * LOG2P)
    anchor = key // (L + 1)  # leaf: first token; expanded: last token
    start = tl.where(key % (L + 1) != 0, anchor + 1 - span, anchor)
    return lvl, start >> (lvl * LOG2P), span


@triton.jit
def static_level_offset(lvl: tl.constexpr, n, LOG2P: tl.constexpr):
    """Start of level `lvl` (compile-time constant) in the concatenation of all levels."""
    off = n * 0
    for below in tl.static_range(lvl):
        off += n >> (below * LOG2P)
    return off


@triton.jit
def stored_level_offset(lvl, n, L: tl.constexpr, LOG2P: tl.constexpr, STORED: tl.constexpr):
    """Start of pooled level `lvl` (tensor, >= 1) among the pooled levels kept in memory (bit l of STORED set:
    level l is stored), laid end to end, lowest first."""
    off = tl.zeros(lvl.shape, tl.int64)
    for below in tl.static_range(1, L - 1):
        if (STORED >> below) & 1:
            off += tl.where(lvl > below, n >> (below * LOG2P), 0)
    return off


@triton.jit
def static_stored_offset(lvl: tl.constexpr, n, LOG2P: tl.constexpr, STORED: tl.constexpr):
    """`stored_level_offset` of a compile-time level."""
    off = n * 0
    for below in tl.static_range(1, lvl):
        if (STORED >> below) & 1:
            off += n >> (below * LOG2P)
    return off


def decode(packed: torch.Tensor, pool: int, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(level, index, expanded) of packed keys, in PyTorch (to build a `Selection`), as int64."""
    packed = packed.long()
    lvl = packed % levels
    key = packed // levels
    span = pool**lvl
    anchor = key // (levels + 1)
    expanded = key % (levels + 1) != 0
    start = torch.where(expanded, anchor + 1 - span, anchor)
    return lvl, start // span, expanded
