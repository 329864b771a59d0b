"""The fused layer on one device as one autograd node: pooling, selection, gather, attention and
scatter-back forward; scatter-back, attention and gather-with-pooling backward.

At short lengths the layer is bound by host time, not by the GPU (at N=8K one forward+backward through
three autograd nodes, SDPA's dispatch and Triton's launch path took 1.66 ms of host time on an H100 host
for 0.2 ms of GPU work). This node calls the attention kernel's own forward and backward ops
(`lighthouse.attention.direct_attention`) and the kernels' functions without autograd (`lighthouse.fused_ops`). Under
torch.compile the layer is the custom op `lighthouse::fused_forward`, whose registered backward is the
custom op `lighthouse::fused_backward`: compiled code runs this same host path instead of launching the
Triton kernels through Inductor, and activation checkpointing recomputes the op. Values equal the
three-node path (`plan`, then `attend`) bit for bit.
"""
from __future__ import annotations

from dataclasses import fields
from functools import lru_cache
from typing import get_type_hints

import torch
from torch import Tensor

from .attention import DirectAttention, causal_attention, direct_attention, sdpa_inputs
from .config import LighthouseConfig, gathered_length
from .fused import attend, plan
from .fused_ops import gather_rows, gather_rows_backward, pyramid_entries, scatter_rows, scatter_rows_backward

# The layer's settings (every field of `LighthouseConfig`), in the order the custom ops take them.
FIELDS = tuple(f.name for f in fields(LighthouseConfig))
_SCHEMA_TYPES = {int: "SymInt", str: "str"}
SETTINGS_SCHEMA = ", ".join(f"{_SCHEMA_TYPES[get_type_hints(LighthouseConfig)[name]]} {name}" for name in FIELDS)


def settings(config: LighthouseConfig) -> tuple:
    """`config`'s fields as the custom ops take them (`FIELDS` order)."""
    return tuple(getattr(config, name) for name in FIELDS)


@lru_cache(maxsize=64)
def _config(*values) -> LighthouseConfig:
    return LighthouseConfig(**dict(zip(FIELDS, values)))


def _attention(backend: str, q: Tensor, length: int) -> DirectAttention:
    """The direct ops of `backend` for attention over `length` gathered rows (the same kernel forward and
    backward: `auto` may choose by length)."""
    attention = direct_attention(backend, q.device, q.dtype, length)
    if attention is None:
        raise ValueError(f"backend={backend!r} has no direct forward and backward ops on {q.device.type}")
    return attention


def _heads_first(qt: Tensor, kt: Tensor, vt: Tensor, attention: DirectAttention) -> tuple[Tensor, Tensor, Tensor]:
    """The gathered rows [B, S, heads, D] as the attention ops take them, [B, heads, S, D] (`sdpa_inputs`:
    kv repeated to the query heads where the kernel needs it)."""
    return sdpa_inputs(qt, kt, vt, attention.name)[:3]


def fused_forward(q: Tensor, k: Tensor, v: Tensor, config: LighthouseConfig, with_lse: bool = True
                  ) -> tuple[Tensor, ...]:
    """(o, and what `fused_backward` takes: slots, Q~, K~, V~ as the attention read them [B, heads, S, D],
    O~ and its logsumexp, which `with_lse=False` may leave empty) for contiguous q [B, N, H, D],
    k, v [B, N, G, D]; no autograd."""
    n = q.shape[1]
    attention = _attention(config.backend, q, gathered_length(n, config.levels, config.pool, config.topk))
    pyramid, order = plan(q, k, v, config)
    gathered = gather_rows(q, k, v, pyramid.q, pyramid.k, pyramid.v, pyramid.stored, order.packed, config.pool,
                           config.levels)
    qh, kh, vh = _heads_first(*gathered, attention)
    oh, lse = attention.forward(qh, kh, vh, with_lse)
    o = scatter_rows(oh.transpose(1, 2), order.slots, n, config.pool, config.levels)
    return o, order.slots, qh, kh, vh, oh, lse


def fused_backward(grad_o: Tensor, slots: Tensor, qh: Tensor, kh: Tensor, vh: Tensor, oh: Tensor, lse: Tensor,
                   kv_heads: int, pool: int, levels: int, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of `fused_forward` from the gradient of o and what it saved; no autograd."""
    n, heads = grad_o.shape[1], grad_o.shape[2]
    grad_ot = scatter_rows_backward(grad_o, slots, n, qh.shape[2], pool, levels, oh.dtype)
    dq, dk, dv = (x.transpose(1, 2) for x in _attention(backend, qh, qh.shape[2]).backward(
        grad_ot.transpose(1, 2), qh, kh, vh, oh, lse))
    if dk.shape[2] != kv_heads:  # kv were repeated for the kernel: sum each group's copies
        dk, dv = (x.unflatten(2, (kv_heads, heads // kv_heads)).sum(3) for x in (dk, dv))
    return gather_rows_backward(dq, dk, dv, slots, n, pool, levels)


def _fused_forward_op(q: Tensor, k: Tensor, v: Tensor, *values) -> tuple[Tensor, ...]:
    return fused_forward(q, k, v, _config(*values))


torch.library.custom_op("lighthouse::fused_forward", _fused_forward_op, mutates_args=(), schema=(
    f"(Tensor q, Tensor k, Tensor v, {SETTINGS_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"))


@torch.library.register_fake("lighthouse::fused_forward")
def _(q, k, v, *values):
    # the settings may be symbolic here (torch.compile made them dynamic): no config, whose cache would hash them
    named = dict(zip(FIELDS, values))
    levels, pool, backend = named["levels"], named["pool"], named["backend"]
    (b, n, h, d), g = q.shape, k.shape[2]
    s = gathered_length(n, levels, pool, named["topk"])
    attention = _attention(backend, q, s)
    qh, kh, vh = _heads_first(q.new_empty(b, s, h, d), k.new_empty(b, s, g, d), v.new_empty(b, s, g, d),
                              attention)
    oh, lse = attention.forward(qh, kh, vh, True)
    slots = q.new_empty(b, g, pyramid_entries(n, pool, levels), dtype=torch.int32)
    return q.new_empty(b, n, h, d), slots, qh, kh, vh, oh, lse


@torch.library.custom_op("lighthouse::fused_backward", mutates_args=())
def _fused_backward_op(grad_o: Tensor, slots: Tensor, qh: Tensor, kh: Tensor, vh: Tensor, oh: Tensor, lse: Tensor,
                       kv_heads: int, pool: int, levels: int, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    return fused_backward(grad_o, slots, qh, kh, vh, oh, lse, kv_heads, pool, levels, backend)


@_fused_backward_op.register_fake
def _(grad_o, slots, qh, kh, vh, oh, lse, kv_heads, pool, levels, backend):
    (b, n, h, d), dtype = grad_o.shape, qh.dtype
    return (grad_o.new_empty(b, n, h, d, dtype=dtype), grad_o.new_empty(b, n, kv_heads, d, dtype=dtype),
            grad_o.new_empty(b, n, kv_heads, d, dtype=dtype))


def _keep_for_backward(ctx, k: Tensor, pool: int, levels: int, backend: str, saved: tuple[Tensor, ...]) -> None:
    """Save what `fused_backward` takes besides the gradient: `fused_forward`'s tensors, then kv heads,
    pool, levels and backend in `ctx.meta`."""
    ctx.save_for_backward(*saved)
    ctx.meta = (k.shape[2], pool, levels, backend)


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, *values = inputs
    named = dict(zip(FIELDS, values))
    _keep_for_backward(ctx, k, named["pool"], named["levels"], named["backend"], output[1:])
    ctx.set_materialize_grads(False)  # only o's gradient is read: no zeros for the saved outputs' (eager: 7x the time)


def _op_backward(ctx, grad_o: Tensor | None, *unused: Tensor | None) -> tuple:
    if grad_o is None:
        return (None,) * (3 + len(FIELDS))
    return (*torch.ops.lighthouse.fused_backward(grad_o, *ctx.saved_tensors, *ctx.meta), *(None for _ in FIELDS))


# Under torch.compile the layer is the forward op with this autograd formula, not `FusedLighthouse`: with an
# autograd.Function around the op, activation checkpointing in a compiled block kept the op's saved tensors
# instead of recomputing them (torch 2.11: four [B, H, S, D] tensors and more per layer).
torch.library.register_autograd("lighthouse::fused_forward", _op_backward, setup_context=_setup_context)


class FusedLighthouse(torch.autograd.Function):
    """q, k, v, config -> o of the fused layer in one node, eager.
    (The custom op with its registered backward, called eagerly, took 242 against 155 us of host time per
    forward+backward on a CPU with the kernels and attention stubbed out.)"""

    @staticmethod
    def forward(ctx, q, k, v, config):
        o, *saved = fused_forward(q, k, v, config)
        _keep_for_backward(ctx, k, config.pool, config.levels, config.backend, tuple(saved))
        return o

    @staticmethod
    def backward(ctx, grad_o):
        return (*fused_backward(grad_o, *ctx.saved_tensors, *ctx.meta), None)


def fused_lighthouse_attention(q: Tensor, k: Tensor, v: Tensor, config: LighthouseConfig) -> Tensor:
    """Lighthouse attention on q [B, N, H, D], k/v [B, N, G, D] -> o [B, N, H, D] (q's dtype), inputs and
    length already checked (`lighthouse.lighthouse_attention` is the public entry).

    One autograd node (`FusedLighthouse`; without gradients, its forward alone; under torch.compile the
    custom op with its registered backward) where the attention kernel has direct ops here
    (`direct_attention`: cuDNN on CUDA, flash on CPU, FlashAttention's ops), else gather, attention and
    scatter-back as three (`lighthouse.fused.plan`, then `attend`). Differentiable in q, k, v; no host synchronisation
    and static
    shapes (CUDA-graph and torch.compile friendly). `lighthouse.pipeline.resolve_implementation` has checked
    that the kernels take the call.
    """
    if config.levels == 1:
        return causal_attention(q, k, v, config.backend)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    s = gathered_length(q.shape[1], config.levels, config.pool, config.topk)
    if direct_attention(config.backend, q.device, q.dtype, s) is not None:
        if torch.compiler.is_compiling():
            return torch.ops.lighthouse.fused_forward(q, k, v, *settings(config))[0]
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return FusedLighthouse.apply(q, k, v, config)
        return fused_forward(q, k, v, config, with_lse=False)[0]
    return attend(q, k, v, plan(q, k, v, config), config)
