"""Stage 4, fused: gather Q~, K~, V~ straight from the token tensors and the pooled levels, and the
backward of gather and pooling together.

Forward: one program per (block of gathered slots, batch * kv-head) decodes each slot's (level, index)
from its packed key and copies the group's query heads, key head and value head rows; an entry of a pooled
level that is not stored (`lighthouse_kernels.pyramid.stored_levels`) is the float32 mean of its tokens, cast once.
Backward: each pyramid entry is gathered at most once per row, so gradient reaches token j only from the
slots that hold an entry covering j, at most one per level. With the inverse map entry -> slot this is a
gather too: dx_j = sum_l dX~[slot(l, j // p^l)] / p^l, summed in float32 and cast once (no atomics).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch, log2, program_block, row_block
from .ordering import decode_entry, static_level_offset, stored_level_offset
from .pyramid import Pyramid


@triton.jit
def _gather_head(x_ptr, pyr_ptr, out_ptr, b, h, s, smask, lvl, idx, pidx, N, NP, S, HX: tl.constexpr,
                 D: tl.constexpr, L: tl.constexpr, LOG2P: tl.constexpr, STORED: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    mask = smask[:, None] & (d < D)[None, :]
    is_stored = ((tl.full(lvl.shape, STORED, tl.int64) >> lvl) & 1) != 0
    base = tl.load(x_ptr + ((b * N + idx) * HX + h)[:, None] * D + d[None, :],
                   mask=mask & (lvl == 0)[:, None], other=0.0)
    pooled = tl.load(pyr_ptr + ((b * NP + pidx) * HX + h)[:, None] * D + d[None, :],
                     mask=mask & is_stored[:, None], other=0.0)
    out = tl.where(is_stored[:, None], pooled, base)
    for rl in tl.static_range(1, L - 1):
        if not (STORED >> rl) & 1:
            # a recomputed level: the mean of the entry's p**rl tokens in float32
            hit = mask & (lvl == rl)[:, None]
            acc = tl.zeros(out.shape, tl.float32)
            for t in tl.static_range(1 << (rl * LOG2P)):
                token = (idx << (rl * LOG2P)) + t
                acc += tl.load(x_ptr + ((b * N + token) * HX + h)[:, None] * D + d[None, :], mask=hit,
                               other=0.0).to(tl.float32)
            out = tl.where(hit, (acc * (1.0 / (1 << (rl * LOG2P)))).to(out.dtype), out)
    tl.store(out_ptr + ((b * S + s) * HX + h)[:, None] * D + d[None, :], out, mask=mask)


@triton.jit
def _gather_kernel(packed_ptr, q_ptr, k_ptr, v_ptr, qp_ptr, kp_ptr, vp_ptr, qo_ptr, ko_ptr, vo_ptr,
                   N, NP, S, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, L: tl.constexpr,
                   LOG2P: tl.constexpr, STORED: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    bg, b, g, s, smask = program_block(G, BLOCK_S, S)
    REP: tl.constexpr = H // G
    lvl, idx, _ = decode_entry(tl.load(packed_ptr + bg * S + s, mask=smask, other=0), L, LOG2P)
    pidx = stored_level_offset(lvl, N, L, LOG2P, STORED) + idx  # row in the stored pooled levels
    for r in tl.static_range(REP):
        _gather_head(q_ptr, qp_ptr, qo_ptr, b, g * REP + r, s, smask, lvl, idx, pidx, N, NP, S, H, D, L, LOG2P,
                     STORED, BLOCK_D)
    _gather_head(k_ptr, kp_ptr, ko_ptr, b, g, s, smask, lvl, idx, pidx, N, NP, S, G, D, L, LOG2P, STORED, BLOCK_D)
    _gather_head(v_ptr, vp_ptr, vo_ptr, b, g, s, smask, lvl, idx, pidx, N, NP, S, G, D, L, LOG2P, STORED, BLOCK_D)


@triton.jit
def _pool_gather_bwd_head(dxt_ptr, dx_ptr, slots_row, b, h, j, jmask, N, S, HX: tl.constexpr,
                          D: tl.constexpr, L: tl.constexpr, LOG2P: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    dmask = (d < D)[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for lvl in tl.static_range(L):
        slot = tl.load(slots_row + static_level_offset(lvl, N, LOG2P) + (j >> (lvl * LOG2P)), mask=jmask, other=-1)
        grad = tl.load(dxt_ptr + ((b * S + slot) * HX + h)[:, None] * D + d[None, :],
                       mask=(slot >= 0)[:, None] & dmask, other=0.0)
        acc += grad.to(tl.float32) * (1.0 / (1 << (lvl * LOG2P)))
    tl.store(dx_ptr + ((b * N + j) * HX + h)[:, None] * D + d[None, :], acc.to(dx_ptr.dtype.element_ty),
             mask=jmask[:, None] & dmask)


@triton.jit
def _pool_gather_bwd_kernel(slots_ptr, dqt_ptr, dkt_ptr, dvt_ptr, dq_ptr, dk_ptr, dv_ptr, N, NTOT, S,
                            H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, L: tl.constexpr,
                            LOG2P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bg, b, g, j, jmask = program_block(G, BLOCK_N, N)
    REP: tl.constexpr = H // G
    slots_row = slots_ptr + bg * NTOT
    for r in tl.static_range(REP):
        _pool_gather_bwd_head(dqt_ptr, dq_ptr, slots_row, b, g * REP + r, j, jmask, N, S, H, D, L, LOG2P, BLOCK_N,
                              BLOCK_D)
    _pool_gather_bwd_head(dkt_ptr, dk_ptr, slots_row, b, g, j, jmask, N, S, G, D, L, LOG2P, BLOCK_N, BLOCK_D)
    _pool_gather_bwd_head(dvt_ptr, dv_ptr, slots_row, b, g, j, jmask, N, S, G, D, L, LOG2P, BLOCK_N, BLOCK_D)


def gather_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qp: torch.Tensor, kp: torch.Tensor,
                vp: torch.Tensor, stored: int, packed: torch.Tensor, pool: int, levels: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q~ [B, S, H, D], K~, V~ [B, S, G, D] in gather order from contiguous q, k, v and their stored pooled
    levels (`Pyramid`); no autograd (`gather_pyramid` is the differentiable form)."""
    b, n, h, d = q.shape
    g, s = k.shape[2], packed.shape[-1]
    qt, kt, vt = q.new_empty(b, s, h, d), k.new_empty(b, s, g, d), v.new_empty(b, s, g, d)
    block_s, block_d = row_block(d)
    launch(
        _gather_kernel, (cdiv(s, block_s), b * g), packed, q, k, v, qp, kp, vp, qt, kt, vt, n, qp.shape[1], s,
        H=h, G=g, D=d, L=levels, LOG2P=log2(pool), STORED=stored, BLOCK_S=block_s, BLOCK_D=block_d,
    )
    return qt, kt, vt


def gather_rows_backward(dqt: torch.Tensor, dkt: torch.Tensor, dvt: torch.Tensor, slots: torch.Tensor,
                         seq_len: int, pool: int, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq [B, N, H, D], dk, dv [B, N, G, D] from the gradients of Q~, K~, V~ through gather and pooling,
    given the inverse map entry -> slot of the gather order."""
    b, s, h, d = dqt.shape
    g = dkt.shape[2]
    dq, dk, dv = dqt.new_empty(b, seq_len, h, d), dkt.new_empty(b, seq_len, g, d), dvt.new_empty(b, seq_len, g, d)
    block_n, block_d = row_block(d)
    launch(
        _pool_gather_bwd_kernel, (cdiv(seq_len, block_n), b * g), slots, dqt.contiguous(), dkt.contiguous(),
        dvt.contiguous(), dq, dk, dv, seq_len, slots.shape[-1], s,
        H=h, G=g, D=d, L=levels, LOG2P=log2(pool), BLOCK_N=block_n, BLOCK_D=block_d,
    )
    return dq, dk, dv


class GatherPyramid(torch.autograd.Function):
    """(q, k, v, their pooled levels, gather order) -> Q~, K~, V~; gradient flows to q, k, v through
    gather and pooling (the pooled levels are a function of q, k, v, not independent inputs)."""

    @staticmethod
    def forward(ctx, q, k, v, qp, kp, vp, stored: int, packed, slots, pool: int, levels: int):
        ctx.save_for_backward(slots)
        ctx.meta = (q.shape[1], pool, levels)
        return gather_rows(q, k, v, qp, kp, vp, stored, packed, pool, levels)

    @staticmethod
    def backward(ctx, dqt, dkt, dvt):
        (slots,) = ctx.saved_tensors
        return (*gather_rows_backward(dqt, dkt, dvt, slots, *ctx.meta), None, None, None, None, None, None, None, None)


def gather_pyramid(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pyramid: Pyramid, packed: torch.Tensor,
                   slots: torch.Tensor, pool: int, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q~ [B, S, H, D], K~, V~ [B, S, G, D] in gather order; differentiable in q, k, v (contiguous)."""
    return GatherPyramid.apply(q, k, v, pyramid.q, pyramid.k, pyramid.v, pyramid.stored, packed, slots, pool, levels)
