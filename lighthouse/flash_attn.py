"""FlashAttention as two custom ops (`backend = "flash_attn"`): `lighthouse::flash_attn_forward` and
`lighthouse::flash_attn_backward`, with fake implementations and a registered backward, so torch.compile traces
a call as one node (no graph break, no `allow_in_graph`) and torch's ring attention can ring it (it returns the
log-sum-exp; `lighthouse.compat.context_parallel` holds the handlers).

The ops run the one registered implementation (`FlashAttnKernels`). It is resolved once, when a config naming
the backend is checked (`resolve_flash_attn`: FlashAttention-4, `flash_attn.cute`, from the `flash` extra), never
inside a traced frame; tests register a CPU stand-in the same way (`register_flash_attn`).
"""
from __future__ import annotations

from functools import cache
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from .compat import flash_attn as fa4

# Where `backend = "auto"` takes FlashAttention-4 instead of cuDNN: per compute capability, the shortest causal
# attention (tokens per sequence) from which it was measured faster, forward+backward, through these ops.
# H200 (sm90): slower up to 8,192 (1.39 against 1.04 ms at B1 H8 D128), faster from 12,288 to 131,072
# (scripts/flash_attn_check.py, docs/records/flash_attn_check.json). A card not listed never takes it.
AUTO_FROM: dict[tuple[int, int], int] = {(9, 0): 12_288}


class FlashAttnKernels(NamedTuple):
    """One FlashAttention implementation: two calls on q [B, S, H, D], k/v [B, S_k, G, D] (G divides H), scale
    1/sqrt(D), no dropout, and the device types it runs on.
    forward(q, k, v, causal) -> (o [B, S, H, D], logsumexp [B, H, S], float32, float64 for float64 inputs);
    backward(grad_o, q, k, v, o, logsumexp, causal) -> (dq, dk, dv)."""

    name: str
    forward: Callable[[Tensor, Tensor, Tensor, bool], tuple[Tensor, Tensor]]
    backward: Callable[..., tuple[Tensor, Tensor, Tensor]]
    devices: tuple[str, ...]


_registered: FlashAttnKernels | None = None


def register_flash_attn(kernels: FlashAttnKernels | None) -> FlashAttnKernels | None:
    """Make `kernels` what every flash_attn call runs (None: nothing); returns the one it replaces."""
    global _registered
    previous, _registered = _registered, kernels
    return previous


def flash_attn_kernels() -> FlashAttnKernels | None:
    """The registered implementation, or None; reads a global only, so traced code may call it."""
    return _registered


@cache
def _load_flash_attention_4() -> FlashAttnKernels | str:
    try:
        return FlashAttnKernels(fa4.NAME, *fa4.load_forward_backward(), ("cuda",))
    except (ImportError, AttributeError) as err:
        return f"{fa4.MODULE}: {err}"


def resolve_flash_attn() -> FlashAttnKernels | None:
    """The registered implementation; if none is, FlashAttention-4, registered on success (imported once per
    process; a failed import is remembered). None where it does not import."""
    if _registered is None:
        loaded = _load_flash_attention_4()
        if isinstance(loaded, FlashAttnKernels):
            register_flash_attn(loaded)
    return _registered


def require_flash_attn() -> FlashAttnKernels:
    """`resolve_flash_attn()`, or ValueError saying what to install."""
    kernels = resolve_flash_attn()
    if kernels is None:
        raise ValueError(
            "backend='flash_attn' needs FlashAttention-4 (the flash extra: pip install -e '.[flash]'), which did not "
            f"import ({_load_flash_attention_4()}); use backend='cudnn' or 'auto'"
        )
    return kernels


def auto_takes_flash_attn(device: torch.device, dtype: torch.dtype, length: int | None) -> bool:
    """Whether `backend = "auto"` runs causal attention over `length` tokens with FlashAttention here: an
    implementation is registered for CUDA, the dtype is bf16/fp16, and `AUTO_FROM` lists the card with a length
    at most `length` (None: unknown, so no)."""
    kernels = _registered
    if kernels is None or device.type != "cuda" or "cuda" not in kernels.devices or length is None:
        return False
    if dtype not in (torch.bfloat16, torch.float16):
        return False
    props = torch.cuda.get_device_properties(device)  # constant under torch.compile
    start = AUTO_FROM.get((props.major, props.minor))
    return start is not None and length >= start


def _kernels() -> FlashAttnKernels:
    if _registered is None:
        raise RuntimeError("lighthouse::flash_attn_* ran with no FlashAttention implementation registered: a config "
                           "with backend 'flash_attn' resolves it when checked (`require_flash_attn`)")
    return _registered


def _lse_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _heads_first(x: Tensor) -> Tensor:
    """[B, S, heads, D] from an implementation -> the ops' [B, heads, S, D], always a view of contiguous
    [B, S, heads, D] memory, as the fake implementations say (compiled code relies on the strides)."""
    return x.contiguous().transpose(1, 2)


# The ops take SDPA's layout, [B, heads, S, D] (the layout torch's ring attention shards on dim 2), and the
# argument names of torch's ring templates, which call them by name.
@torch.library.custom_op("lighthouse::flash_attn_forward", mutates_args=())
def flash_attn_forward(query: Tensor, key: Tensor, value: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    """(o [B, H, S, D], logsumexp [B, H, S]) of softmax attention, scale 1/sqrt(D), on q [B, H, S, D],
    k/v [B, G, S_k, D]; the log-sum-exp carries no gradient."""
    o, lse = _kernels().forward(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal)
    return _heads_first(o), lse.contiguous()


@flash_attn_forward.register_fake
def _(query, key, value, is_causal):
    b, h, s, d = query.shape
    return query.new_empty(b, s, h, d).transpose(1, 2), query.new_empty(b, h, s, dtype=_lse_dtype(query))


@torch.library.custom_op("lighthouse::flash_attn_backward", mutates_args=())
def flash_attn_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor, logsumexp: Tensor,
                        is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of `flash_attn_forward` from the gradient of o (layouts as its inputs)."""
    grads = _kernels().backward(*(x.transpose(1, 2) for x in (grad_out, query, key, value, out)), logsumexp, is_causal)
    return tuple(_heads_first(g) for g in grads)


@flash_attn_backward.register_fake
def _(grad_out, query, key, value, out, logsumexp, is_causal):
    return tuple(x.new_empty(x.shape[0], x.shape[2], x.shape[1], x.shape[3]).transpose(1, 2)
                 for x in (query, key, value))


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    *qkv, is_causal = inputs
    ctx.save_for_backward(*qkv, *output)
    ctx.is_causal = is_causal
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out: Tensor | None, _grad_lse: None) -> tuple:
    if grad_out is None:
        return None, None, None, None
    return (*torch.ops.lighthouse.flash_attn_backward(grad_out, *ctx.saved_tensors, ctx.is_causal), None)


flash_attn_forward.register_autograd(_backward, setup_context=_setup_context)


def flash_attn_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention on q [B, H, S, D], k/v [B, G, S, D] (DTensors sharded on S included: torch's ring
    attention then rings it) -> [B, H, S, D], differentiable in q, k, v."""
    return torch.ops.lighthouse.flash_attn_forward(q, k, v, True)[0]
