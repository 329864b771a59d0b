"""Launches, launch shapes, program coordinates and window loads shared by the kernels."""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .compat import constexpr_values, is_jit_function, launch_hooks_set, run_compiled

# (kernel, device, argument specialisation, constexprs and options) -> (compiled kernel, constexpr values)
_COMPILED: dict[tuple, tuple[Any, tuple]] = {}


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host (`triton.cdiv` is a constexpr function: about 5 us a call there)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n >= 1, on the host (as `cdiv`, without Triton's constexpr machinery)."""
    return 1 << (n - 1).bit_length()


def _specialisation(args: tuple) -> tuple:
    """What Triton specialises a launch on: a tensor's dtype and 16-byte alignment, any other argument's
    value itself (so equal keys mean equal specialisations; a tensor subclass keys by identity, which
    never repeats a launch directly, but stays correct)."""
    return tuple([(a.dtype, a.data_ptr() % 16 == 0) if type(a) is torch.Tensor else a for a in args])


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """`kernel[grid](*args, **kwargs)` with the runtime arguments positional and the constexprs and launch
    options by keyword. Once a specialisation has compiled, later launches on CUDA call its launcher
    directly: Triton's per-call binding costs more host time than the launch itself (30 against 11 us for
    one of these kernels on an H100 host), and at N=8K the layer is host-bound.

    Triton's own path runs under its interpreter, while torch.compile traces (it traces that path) and
    while launch hooks are set (profilers read them)."""
    if not is_jit_function(kernel) or torch.compiler.is_compiling() or launch_hooks_set():
        kernel[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    key = (kernel, device, _specialisation(args), tuple(kwargs.items()))
    entry = _COMPILED.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **kwargs)
        constexprs = constexpr_values(kernel, args, kwargs)
        if constexprs is not None:
            _COMPILED[key] = (compiled, constexprs)
        return
    compiled, constexprs = entry
    run_compiled(compiled, grid, device, args, constexprs)


def row_block(head_dim: int) -> tuple[int, int]:
    """(rows per program, head dim padded to a power of two): about 2K elements per head slab (16 rows of
    128: on an H100 at N=512K the gather is 15% faster than with 32 rows, the other copies no slower)."""
    block_d = next_power_of_2(head_dim)
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
