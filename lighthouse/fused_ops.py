"""The kernels' stages as the fused compositions call them (`lighthouse.fused`, which context parallelism
runs per chunk through `lighthouse.context_parallel.shard`): under torch.compile each stage is a custom op
(`lighthouse::*`, gather and scatter-back with registered backwards that are custom ops too), so Dynamo never
traces into Triton's launcher, single device and per CP chunk alike; eagerly the kernels' own functions and
autograd nodes run, without the custom-op dispatch's host time. Both give the same values bit for bit.

Selection (`pool_and_score`, `causal_score_levels`, `select_order`) carries no gradient; `gather_pyramid` and
`scatter_back` are differentiable in q, k, v and O~. This is the one module of `lighthouse/` that imports
`lighthouse_kernels/`: the one-node layer (`fused_node`, itself a custom op under compile) takes the kernels'
forward and backward functions without autograd (`gather_rows`, `scatter_rows` and their backwards) and their types from
here.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lighthouse_kernels import gather as gather_kernels
from lighthouse_kernels import pyramid as pyramid_kernels
from lighthouse_kernels import scatter as scatter_kernels
from lighthouse_kernels import selection as selection_kernels
from lighthouse_kernels.gather import gather_rows, gather_rows_backward
from lighthouse_kernels.ordering import decode, packed_dtype
from lighthouse_kernels.pyramid import Pyramid, pyramid_entries, stored_levels, stored_rows
from lighthouse_kernels.scatter import scatter_rows, scatter_rows_backward
from lighthouse_kernels.selection import GatherOrder

__all__ = [
    "GatherOrder", "Pyramid", "causal_score_levels", "decode", "gather_pyramid", "gather_rows", "gather_rows_backward",
    "pool_and_score", "pyramid_entries", "scatter_back", "scatter_rows", "scatter_rows_backward", "select_order",
    "stored_levels",
]

from .config import gathered_length


def _compiling() -> bool:
    return torch.compiler.is_compiling()


@torch.library.custom_op("lighthouse::pool_and_score", mutates_args=())
def _pool_and_score(q: Tensor, k: Tensor, v: Tensor, pool: int, levels: int, scores: bool, stored: int
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(pyramid_kernels.pool_and_score(q, k, v, pool, levels, scores=scores, stored=stored)[:5])


@_pool_and_score.register_fake
def _(q, k, v, pool, levels, scores, stored):
    (b, n, h, d), g = q.shape, k.shape[2]
    rows = stored_rows(n, pool, levels, stored)
    shape = (b, g, pyramid_entries(n, pool, levels)) if scores else (0,)
    return (q.new_empty(b, rows, h, d), k.new_empty(b, rows, g, d), v.new_empty(b, rows, g, d),
            q.new_empty(shape, dtype=torch.float32), q.new_empty(shape, dtype=torch.float32))


def pool_and_score(q: Tensor, k: Tensor, v: Tensor, pool: int, levels: int, scores: bool, stored: int) -> Pyramid:
    """`lighthouse_kernels.pyramid.pool_and_score` (no gradient)."""
    if _compiling():
        return Pyramid(*torch.ops.lighthouse.pool_and_score(q, k, v, pool, levels, scores, stored), stored)
    return pyramid_kernels.pool_and_score(q, k, v, pool, levels, scores=scores, stored=stored)


@torch.library.custom_op("lighthouse::causal_score_levels", mutates_args=())
def _causal_score_levels(sq: Tensor, sk: Tensor, seq_len: int, pool: int, levels: int, history_q: Tensor | None,
                         history_k: Tensor | None) -> tuple[Tensor, Tensor]:
    history = None if history_q is None else (history_q, history_k)
    return pyramid_kernels.causal_score_levels(sq.clone(), sk.clone(), seq_len, pool, levels, history)


@_causal_score_levels.register_fake
def _(sq, sk, seq_len, pool, levels, history_q, history_k):
    return torch.empty_like(sq), torch.empty_like(sk)


def causal_score_levels(sq: Tensor, sk: Tensor, seq_len: int, pool: int, levels: int,
                        history: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """`lighthouse_kernels.pyramid.causal_score_levels`: the causal levels of sq, sk (eagerly rewritten in place, under
    torch.compile new tensors)."""
    if _compiling():
        return torch.ops.lighthouse.causal_score_levels(sq, sk, seq_len, pool, levels, *(history or (None, None)))
    return pyramid_kernels.causal_score_levels(sq, sk, seq_len, pool, levels, history)


@torch.library.custom_op("lighthouse::select_order", mutates_args=())
def _select_order(sq: Tensor, sk: Tensor, seq_len: int, pool: int, levels: int, topk: int, tile_budget: int,
                  prefix: bool, strict: bool) -> tuple[Tensor, Tensor]:
    return tuple(selection_kernels.select_order(sq, sk, seq_len, pool, levels, topk, tile_budget, prefix,
                                                strict=strict))


@_select_order.register_fake
def _(sq, sk, seq_len, pool, levels, topk, tile_budget, prefix, strict):
    b, g, entries = sq.shape
    packed = sq.new_empty(b, g, gathered_length(seq_len, levels, pool, topk), dtype=packed_dtype(seq_len, levels))
    return packed, sq.new_empty(b, g, entries, dtype=torch.int32)


def select_order(sq: Tensor, sk: Tensor, seq_len: int, pool: int, levels: int, topk: int, tile_budget: int,
                 prefix: bool = True, strict: bool = False) -> GatherOrder:
    """`lighthouse_kernels.selection.select_order` (no gradient)."""
    if _compiling():
        return GatherOrder(*torch.ops.lighthouse.select_order(sq, sk, seq_len, pool, levels, topk, tile_budget,
                                                              prefix, strict))
    return selection_kernels.select_order(sq, sk, seq_len, pool, levels, topk, tile_budget, prefix, strict=strict)


@torch.library.custom_op("lighthouse::gather_rows", mutates_args=())
def _gather_rows(q: Tensor, k: Tensor, v: Tensor, qp: Tensor, kp: Tensor, vp: Tensor, stored: int, packed: Tensor,
                 slots: Tensor, pool: int, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    return gather_rows(q, k, v, qp, kp, vp, stored, packed, pool, levels)


@_gather_rows.register_fake
def _(q, k, v, qp, kp, vp, stored, packed, slots, pool, levels):
    (b, n, h, d), g, s = q.shape, k.shape[2], packed.shape[-1]
    return q.new_empty(b, s, h, d), k.new_empty(b, s, g, d), v.new_empty(b, s, g, d)


@torch.library.custom_op("lighthouse::gather_rows_backward", mutates_args=())
def _gather_rows_backward(dqt: Tensor, dkt: Tensor, dvt: Tensor, slots: Tensor, seq_len: int, pool: int,
                          levels: int) -> tuple[Tensor, Tensor, Tensor]:
    return gather_rows_backward(dqt, dkt, dvt, slots, seq_len, pool, levels)


@_gather_rows_backward.register_fake
def _(dqt, dkt, dvt, slots, seq_len, pool, levels):
    (b, _, h, d), g = dqt.shape, dkt.shape[2]
    return dqt.new_empty(b, seq_len, h, d), dkt.new_empty(b, seq_len, g, d), dvt.new_empty(b, seq_len, g, d)


def _gather_setup(ctx, inputs: tuple, output: tuple) -> None:
    q, *_, slots, pool, levels = inputs
    ctx.save_for_backward(slots)
    ctx.meta = (q.shape[1], pool, levels)


def _gather_backward(ctx, dqt: Tensor, dkt: Tensor, dvt: Tensor) -> tuple:
    (slots,) = ctx.saved_tensors
    grads = torch.ops.lighthouse.gather_rows_backward(dqt, dkt, dvt, slots, *ctx.meta)
    return (*grads, *(None for _ in range(8)))


torch.library.register_autograd("lighthouse::gather_rows", _gather_backward, setup_context=_gather_setup)


def gather_pyramid(q: Tensor, k: Tensor, v: Tensor, pyramid: Pyramid, packed: Tensor, slots: Tensor, pool: int,
                   levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """`lighthouse_kernels.gather.gather_pyramid`: Q~, K~, V~ in gather order, differentiable in q, k, v."""
    if _compiling():
        return torch.ops.lighthouse.gather_rows(q, k, v, pyramid.q, pyramid.k, pyramid.v, pyramid.stored, packed,
                                                slots, pool, levels)
    return gather_kernels.gather_pyramid(q, k, v, pyramid, packed, slots, pool, levels)


@torch.library.custom_op("lighthouse::scatter_rows", mutates_args=())
def _scatter_rows(o_tilde: Tensor, slots: Tensor, seq_len: int, pool: int, levels: int, spill: bool,
                  out_dtype: torch.dtype | None) -> Tensor:
    return scatter_rows(o_tilde, slots, seq_len, pool, levels, spill, out_dtype)


@_scatter_rows.register_fake
def _(o_tilde, slots, seq_len, pool, levels, spill, out_dtype):
    b, _, h, d = o_tilde.shape
    n_out = seq_len + (pool ** (levels - 1) - 1 if spill else 0)
    return o_tilde.new_empty(b, n_out, h, d, dtype=out_dtype or o_tilde.dtype)


@torch.library.custom_op("lighthouse::scatter_rows_backward", mutates_args=())
def _scatter_rows_backward(grad_o: Tensor, slots: Tensor, seq_len: int, gathered: int, pool: int, levels: int,
                           dtype: torch.dtype) -> Tensor:
    return scatter_rows_backward(grad_o, slots, seq_len, gathered, pool, levels, dtype)


@_scatter_rows_backward.register_fake
def _(grad_o, slots, seq_len, gathered, pool, levels, dtype):
    b, _, h, d = grad_o.shape
    return grad_o.new_empty(b, gathered, h, d, dtype=dtype)


def _scatter_setup(ctx, inputs: tuple, output: Tensor) -> None:
    o_tilde, slots, seq_len, pool, levels, _, _ = inputs
    ctx.save_for_backward(slots)
    ctx.meta = (seq_len, o_tilde.shape[1], pool, levels, o_tilde.dtype)


def _scatter_backward(ctx, grad_o: Tensor) -> tuple:
    (slots,) = ctx.saved_tensors
    return torch.ops.lighthouse.scatter_rows_backward(grad_o, slots, *ctx.meta), *(None for _ in range(6))


torch.library.register_autograd("lighthouse::scatter_rows", _scatter_backward, setup_context=_scatter_setup)


def scatter_back(o_tilde: Tensor, slots: Tensor, seq_len: int, pool: int, levels: int, spill: bool = False,
                 out_dtype: torch.dtype | None = None) -> Tensor:
    """`lighthouse_kernels.scatter.scatter_back`: o from O~ through the inverse map, differentiable in O~."""
    if _compiling():
        return torch.ops.lighthouse.scatter_rows(o_tilde, slots, seq_len, pool, levels, spill, out_dtype)
    return scatter_kernels.scatter_back(o_tilde, slots, seq_len, pool, levels, spill, out_dtype)
