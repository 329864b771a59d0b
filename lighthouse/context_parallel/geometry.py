"""Which chunks a rank holds, what a chunk selects with, and where halos go (SPEC section 6).

Layout (torchtitan's head/tail load balancing): with CP degree W the sequence is cut into 2W equal chunks
and rank r holds chunks r and 2W-1-r, concatenated as [head, tail] along the sequence axis.
"""
from __future__ import annotations

import dataclasses

from ..config import LighthouseConfig
from ..selection import Selection

HEAD, TAIL = 0, 1
Slot = tuple[int, int]  # (rank, HEAD or TAIL): one owned chunk


def owned_chunks(rank: int, cp_degree: int) -> tuple[int, int]:
    """(head, tail) chunk indices of `rank`: chunks r and 2W-1-r of the 2W equal chunks."""
    return rank, 2 * cp_degree - 1 - rank


def prefixes(rank: int, cp_degree: int) -> tuple[bool, bool]:
    """Whether `rank`'s head, resp. tail, chunk keeps the prefix guarantee: only chunk 0 (global token 0)."""
    return tuple(chunk == 0 for chunk in owned_chunks(rank, cp_degree))


def check_context_parallel(config: LighthouseConfig, seq_len: int, cp_degree: int) -> None:
    """Raise ValueError naming the values if `config` cannot run on `seq_len` tokens split over `cp_degree` ranks.

    Degree 1 still means two chunks (a one-rank ring, as in the tests); a job without CP checks
    `config.validate(seq_len)` instead.
    """
    if cp_degree < 1:
        raise ValueError(f"context_parallel_degree={cp_degree} must be >= 1")
    config.validate(seq_len)
    chunks = 2 * cp_degree
    if seq_len % chunks != 0:
        raise ValueError(
            f"seq_len={seq_len} does not split into 2*context_parallel_degree={chunks} equal chunks "
            f"(context_parallel_degree={cp_degree})"
        )
    if config.levels == 1:
        return
    if config.num_tiles % chunks != 0:
        raise ValueError(
            f"topk/tile_budget={config.num_tiles} tiles (topk={config.topk}, tile_budget={config.tile_budget}) do "
            f"not split evenly over the 2*context_parallel_degree={chunks} chunks of seq_len={seq_len} "
            f"(context_parallel_degree={cp_degree}); a tile may not cross a chunk: make topk/tile_budget a multiple "
            f"of {chunks}"
        )
    # Whole tiles per chunk, hence whole coarsest entries: pooling windows never cross a chunk either.
    chunk_len = seq_len // chunks
    if config.scorer == "dilated" and chunk_len % config.dilation != 0:
        raise ValueError(
            f"chunk length seq_len/(2*context_parallel_degree)={chunk_len} (seq_len={seq_len}, "
            f"context_parallel_degree={cp_degree}) is not divisible by dilation={config.dilation}"
        )


def chunk_config(config: LighthouseConfig, cp_degree: int) -> LighthouseConfig:
    """The config one chunk selects with: topk / (2W), same tile budget, hence the same tiles."""
    return dataclasses.replace(config, topk=config.topk // (2 * cp_degree))


def offset_selection(selection: Selection, chunk: int, chunk_len: int, pool: int) -> Selection:
    """A chunk's selection in global coordinates: level-l indices shifted by the chunk's start // pool**l."""
    start = chunk * chunk_len
    return Selection(selection.level, selection.index + start // pool**selection.level, selection.expanded)


def halo_sources(rank: int, cp_degree: int) -> tuple[Slot | None, Slot]:
    """The chunks whose halos land on this rank's head chunk, resp. its tail chunk (chunk c sends to c+1).

    Head chunk r receives from chunk r-1, rank r-1's head (nothing for chunk 0). Tail chunk 2W-1-r
    receives from chunk 2W-2-r: rank r+1's tail, or for the middle rank W-1 its own head (chunk W-1).
    """
    into_head = (rank - 1, HEAD) if rank > 0 else None
    into_tail = (rank + 1, TAIL) if rank + 1 < cp_degree else (rank, HEAD)
    return into_head, into_tail


def halo_destinations(rank: int, cp_degree: int) -> tuple[Slot, Slot | None]:
    """The chunks this rank's head halo, resp. tail halo, lands on: the inverse of `halo_sources`.

    Rank 0's tail is the last chunk: its halo reaches past the sequence and is dropped.
    """
    head_to = (rank + 1, HEAD) if rank + 1 < cp_degree else (rank, TAIL)
    tail_to = (rank - 1, TAIL) if rank > 0 else None
    return head_to, tail_to
