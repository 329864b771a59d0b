"""Stage 5, fused: deterministic scatter-back (SPEC section 5) as two gathers, no atomics.

Forward: position j receives, from each level l, the entry i = (j+1) // p^l - 1 (the only level-l entry
whose shifted range R(l, i) holds j) if that entry was gathered; the inverse map entry -> slot says
where its row is. The <= L rows are summed in float32 and cast once.
Backward: each slot sums the output gradient over its own range R(l, i), in float32, cast once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import log2, program_block, row_block
from .ordering import decode_entry, static_level_offset


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
def _scatter_bwd_kernel(do_ptr, packed_ptr, dot_ptr, NOUT, S, H: tl.constexpr, G: tl.constexpr,
                        D: tl.constexpr, L: tl.constexpr, LOG2P: tl.constexpr, BLOCK_S: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    bg, b, g, s, smask = program_block(G, BLOCK_S, S)
    REP: tl.constexpr = H // G
    d = tl.arange(0, BLOCK_D)
    dmask = (d < D)[None, :]
    _, idx, span = decode_entry(tl.load(packed_ptr + bg * S + s, mask=smask, other=0), L, LOG2P)
    first = idx * span + span - 1
    widest = tl.max(tl.where(smask, span, 0), axis=0)
    for r in tl.static_range(REP):
        h = g * REP + r
        acc = tl.zeros([BLOCK_S, BLOCK_D], tl.float32)
        t = widest * 0  # (a while loop: the interpreter cannot run range() over a run-time bound)
        while t < widest:
            row = first + t
            hit = smask & (t < span) & (row < NOUT)
            grad = tl.load(do_ptr + ((b * NOUT + row) * H + h)[:, None] * D + d[None, :],
                           mask=hit[:, None] & dmask, other=0.0)
            acc += grad.to(tl.float32)
            t += 1
        tl.store(dot_ptr + ((b * S + s) * H + h)[:, None] * D + d[None, :], acc.to(dot_ptr.dtype.element_ty),
                 mask=smask[:, None] & dmask)



class ScatterBack(torch.autograd.Function):
    """o_tilde [B, S, H, D] -> o [B, N(+spill), H, D] given the gather order and its inverse map.

    Sums in float32 and stores in `out_dtype` (o_tilde's dtype if None); the gradient is o_tilde's dtype.
    """

    @staticmethod
    def forward(ctx, o_tilde, packed, slots, seq_len: int, pool: int, levels: int, spill: bool,
                out_dtype: torch.dtype | None):
        b, s, h, d = o_tilde.shape
        g = packed.shape[1]
        n_out = seq_len + (pool ** (levels - 1) - 1 if spill else 0)
        o = o_tilde.new_empty(b, n_out, h, d, dtype=out_dtype or o_tilde.dtype)
        block_n, block_d = row_block(d)
        _scatter_fwd_kernel[(triton.cdiv(n_out, block_n), b * g)](
            o_tilde.contiguous(), slots, o, seq_len, n_out, slots.shape[-1], s, H=h, G=g, D=d, L=levels,
            LOG2P=log2(pool), BLOCK_N=block_n, BLOCK_D=block_d,
        )
        ctx.save_for_backward(packed)
        ctx.meta = (pool, levels, o_tilde.dtype)
        return o

    @staticmethod
    def backward(ctx, grad_o):
        (packed,) = ctx.saved_tensors
        pool, levels, ot_dtype = ctx.meta
        b, n_out, h, d = grad_o.shape
        g, s = packed.shape[1], packed.shape[2]
        grad_ot = grad_o.new_empty(b, s, h, d, dtype=ot_dtype)
        block_s, block_d = row_block(d)
        _scatter_bwd_kernel[(triton.cdiv(s, block_s), b * g)](
            grad_o.contiguous(), packed, grad_ot, n_out, s, H=h, G=g, D=d, L=levels,
            LOG2P=log2(pool), BLOCK_S=block_s, BLOCK_D=block_d,
        )
        return grad_ot, None, None, None, None, None, None, None


def scatter_back(o_tilde: torch.Tensor, packed: torch.Tensor, slots: torch.Tensor, seq_len: int, pool: int,
                 levels: int, spill: bool = False, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum every gathered row into its shifted range R(l, i), clipped to [0, N) (or kept up to
    N + p^(L-1) - 1 with `spill`, as `lighthouse.scatter_back`); see ScatterBack. `out_dtype=torch.float32`
    keeps the float32 sums for a caller that still adds to them (context parallelism's halos)."""
    return ScatterBack.apply(o_tilde, packed, slots, seq_len, pool, levels, spill, out_dtype)
