"""Launch shapes shared by the row-copying kernels."""
from __future__ import annotations

import triton


def row_block(head_dim: int) -> tuple[int, int]:
    """(rows per program, head dim padded to a power of two): about 4K elements per head slab."""
    block_d = triton.next_power_of_2(head_dim)
    return max(16, 4096 // block_d), block_d


def log2(pool: int) -> int:
    """log2 of a power-of-two pooling factor (kernels shift instead of multiplying)."""
    return pool.bit_length() - 1
