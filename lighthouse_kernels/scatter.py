"""Stage 5, fused: deterministic scatter-back (SPEC section 5) as two gathers, no atomics.

Forward: position j receives, from each level l, the entry i = (j+1) // p^l - 1 (the only level-l entry
whose shifted range R(l, i) holds j) if that entry was gathered; the inverse map entry -> slot says
where its row is. The <= L rows are summed in float32 and cast once.
Backward: each slot gets the output gradient summed over its own range R(l, i), in float32, cast once;
the ranges of one level tile the sequence, so one pass over the gradient sums every level's windows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch, load_windows, log2, next_power_of_2, program_block, row_block
from .ordering import static_level_offset

WINDOW_TOKENS = 64  # positions per program of the backward (at least one coarsest window), 2 warps per 64


@triton.jit
def _scatter_fwd_kernel(ot_ptr, slots_ptr, o_ptr, N, NOUT, NTOT, S, H: tl.constexpr, G: tl.constexpr,
                        D: tl.constexpr, L: tl.constexpr, LOG2P: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    bg, b, g, j, jmask = program_block(G, BLOCK_N, NOUT)
    REP: tl.constexpr = H // G
    d = tl.arange(0, BLOCK_D)
    dmask = (d < D)[None, :]
    slots_row = slots_ptr + bg * NTOT
    for r in tl.static_range(REP):
        h = g * REP + r
        acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        for lvl in tl.static_range(L):
            i = ((j + 1) >> (lvl * LOG2P)) - 1
            hit = jmask & (i >= 0) & (i < (N >> (lvl * LOG2P)))
            slot = tl.load(slots_row + static_level_offset(lvl, N, LOG2P) + i, mask=hit, other=-1)
            row = tl.load(ot_ptr + ((b * S + slot) * H + h)[:, None] * D + d[None, :],
                          mask=(slot >= 0)[:, None] & dmask, other=0.0)
            acc += row.to(tl.float32)
        tl.store(o_ptr + ((b * NOUT + j) * H + h)[:, None] * D + d[None, :], acc.to(o_ptr.dtype.element_ty),
                 mask=jmask[:, None] & dmask)


@triton.jit
def _scatter_bwd_kernel(do_ptr, slots_ptr, dot_ptr, N, NOUT, NTOT, S, H: tl.constexpr, G: tl.constexpr,
                        D: tl.constexpr, L: tl.constexpr, LOG2P: tl.constexpr, BLOCK_U: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """Shifted by one token (u = j + 1), the range R(l, i) is the aligned window i + 1 of p**l positions, so a
    program owning BLOCK_U positions owns whole windows of every level: it sums the windows of each level's
    gathered entries (every coarsest entry, few finer ones) and writes the sums to their slots."""
    bg = tl.program_id(1).to(tl.int64)
    b = bg // G
    g = bg % G
    u0 = tl.program_id(0) * BLOCK_U
    REP: tl.constexpr = H // G
    d = tl.arange(0, BLOCK_D)
    dmask = (d < D)[None, :]
    slots_row = slots_ptr + bg * NTOT
    for lvl in tl.static_range(L):
        i = (u0 >> (lvl * LOG2P)) + tl.arange(0, BLOCK_U >> (lvl * LOG2P)) - 1
        valid = (i >= 0) & (i < (N >> (lvl * LOG2P)))
        slot = tl.load(slots_row + static_level_offset(lvl, N, LOG2P) + i, mask=valid, other=-1)
        for r in tl.static_range(REP):
            h = g * REP + r
            # rows: the windows of the level's entries, shifted back one token (tokens < 0 or >= NOUT: zero)
            windows = load_windows(do_ptr, u0 - 1, b, h, NOUT, slot >= 0, H, D, BLOCK_U >> (lvl * LOG2P),
                                   1 << (lvl * LOG2P), BLOCK_D)
            sums = tl.sum(windows, axis=1)
            tl.store(dot_ptr + ((b * S + slot) * H + h)[:, None] * D + d[None, :],
                     sums.to(dot_ptr.dtype.element_ty), mask=(slot >= 0)[:, None] & dmask)


def scatter_rows(o_tilde: torch.Tensor, slots: torch.Tensor, seq_len: int, pool: int, levels: int,
                 spill: bool = False, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """o [B, N(+spill), H, D] from o_tilde [B, S, H, D] and the inverse map entry -> slot of the gather
    order, summed in float32 and stored in `out_dtype` (o_tilde's dtype if None); no autograd
    (`scatter_back` is the differentiable form)."""
    b, s, h, d = o_tilde.shape
    g = slots.shape[1]
    n_out = seq_len + (pool ** (levels - 1) - 1 if spill else 0)
    o = o_tilde.new_empty(b, n_out, h, d, dtype=out_dtype or o_tilde.dtype)
    block_n, block_d = row_block(d)
    launch(
        _scatter_fwd_kernel, (cdiv(n_out, block_n), b * g), o_tilde.contiguous(), slots, o, seq_len, n_out,
        slots.shape[-1], s, H=h, G=g, D=d, L=levels, LOG2P=log2(pool), BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=2,
    )
    return o


def scatter_rows_backward(grad_o: torch.Tensor, slots: torch.Tensor, seq_len: int, gathered: int, pool: int,
                          levels: int, dtype: torch.dtype) -> torch.Tensor:
    """The gradient of o_tilde [B, S=gathered, H, D] in `dtype` from grad_o [B, N(+spill), H, D]: each slot's
    sum of grad_o over its shifted range, in float32."""
    b, n_out, h, d = grad_o.shape
    g = slots.shape[1]
    grad_ot = grad_o.new_empty(b, gathered, h, d, dtype=dtype)
    span = pool ** (levels - 1)
    block_u = max(span, WINDOW_TOKENS)
    launch(
        _scatter_bwd_kernel, (cdiv(seq_len + span, block_u), b * g), grad_o.contiguous(), slots, grad_ot,
        seq_len, n_out, slots.shape[-1], gathered, H=h, G=g, D=d, L=levels, LOG2P=log2(pool), BLOCK_U=block_u,
        BLOCK_D=next_power_of_2(d), num_warps=max(2, block_u // 32),
    )
    return grad_ot


class ScatterBack(torch.autograd.Function):
    """o_tilde [B, S, H, D] -> o [B, N(+spill), H, D] given the inverse map entry -> slot of the gather order
    (`scatter_rows`); the gradient is o_tilde's dtype."""

    @staticmethod
    def forward(ctx, o_tilde, slots, seq_len: int, pool: int, levels: int, spill: bool,
                out_dtype: torch.dtype | None):
        ctx.save_for_backward(slots)
        ctx.meta = (seq_len, o_tilde.shape[1], pool, levels, o_tilde.dtype)
        return scatter_rows(o_tilde, slots, seq_len, pool, levels, spill, out_dtype)

    @staticmethod
    def backward(ctx, grad_o):
        (slots,) = ctx.saved_tensors
        return scatter_rows_backward(grad_o, slots, *ctx.meta), None, None, None, None, None, None


def scatter_back(o_tilde: torch.Tensor, slots: torch.Tensor, seq_len: int, pool: int, levels: int,
                 spill: bool = False, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum every gathered row into its shifted range R(l, i), clipped to [0, N) (or kept up to
    N + p^(L-1) - 1 with `spill`, as `lighthouse.scatter_back`); see ScatterBack. `out_dtype=torch.float32`
    keeps the float32 sums for a caller that still adds to them (context parallelism's halos)."""
    return ScatterBack.apply(o_tilde, slots, seq_len, pool, levels, spill, out_dtype)
