"""Launch shapes, program coordinates and window loads shared by the row-copying kernels."""
from __future__ import annotations

import triton
import triton.language as tl


def row_block(head_dim: int) -> tuple[int, int]:
    """(rows per program, head dim padded to a power of two): about 2K elements per head slab (16 rows of
    128: on an H100 at N=512K the gather is 15% faster than with 32 rows, the other copies no slower)."""
    block_d = triton.next_power_of_2(head_dim)
    return max(16, 2048 // block_d), block_d


def log2(pool: int) -> int:
    """log2 of a power-of-two pooling factor (kernels shift instead of multiplying)."""
    return pool.bit_length() - 1


@triton.jit
def program_block(G: tl.constexpr, BLOCK: tl.constexpr, limit):
    """This program's (batch*kv-head row, batch, kv head, block of positions, mask of positions < limit)
    on a grid of (position blocks, B*G)."""
    bg = tl.program_id(1).to(tl.int64)
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    return bg, bg // G, bg % G, pos, pos < limit


@triton.jit
def every_row(ROWS: tl.constexpr):
    """A `wanted` mask of `load_windows` that keeps every row."""
    return tl.full([ROWS], 1, tl.int1)


@triton.jit
def load_windows(x_ptr, t0, b, h, N, wanted, HX: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                 SPAN: tl.constexpr, BLOCK_D: tl.constexpr):
    """Tokens [t0, t0 + ROWS*SPAN) of head h of x [B, N, HX, D] as float32 [ROWS, SPAN, BLOCK_D], one window
    per row; tokens outside [0, N) and rows not `wanted` are not read and count zero.

    Loading each window as its own axis keeps every reduction over a window inside registers and warps
    (reshaping one tile level by level costs shared-memory round trips); re-reads hit the cache.
    """
    r = tl.arange(0, ROWS)[:, None, None]
    c = tl.arange(0, SPAN)[None, :, None]
    d = tl.arange(0, BLOCK_D)[None, None, :]
    t = t0 + r * SPAN + c
    mask = (t >= 0) & (t < N) & (d < D) & wanted[:, None, None]
    return tl.load(x_ptr + ((b * N + t) * HX + h) * D + d, mask=mask, other=0.0).to(tl.float32)
