"""Stage 4b: stock causal attention on the gathered sub-sequence; no sparse index enters it (SPEC section 4).

The one place that turns `LighthouseConfig.backend` into a kernel (`resolve_backend`: an SDPA kernel or
FlashAttention's ops), decides whether kv heads are repeated for it (`sdpa_inputs`) and calls it
(`heads_first_causal`); context parallelism's ring attention and the model's dense layers use the same three.
`direct_attention` gives the same kernels as a forward and a backward op for a caller that holds them in
its own autograd node (the fused layer).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .compat import sdpa
from .flash_attn import auto_takes_flash_attn, flash_attn_causal, flash_attn_kernels

SDPA_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# Backends whose kernel takes fewer kv heads than query heads directly (enable_gqa); others get repeated kv.
NATIVE_GQA = ("flash", "math", "flash_attn")
# SDPA backends that run on CUDA only (on CPU, SDPA finds no kernel for them); flash_attn runs where its
# registered implementation does.
CUDA_ONLY = ("cudnn", "efficient")
# Backends context parallelism rings: torch's dispatcher rings the SDPA ones (the math backend has no ring
# rule), and flash_attn's ops through handlers added to it (`lighthouse.compat.context_parallel`).
RING_BACKENDS = ("cudnn", "flash", "efficient", "flash_attn")


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype, ring: bool = False,
                    length: int | None = None) -> str:
    """The kernel `backend` means for causal attention over `length` tokens here. 'auto' is cuDNN on CUDA (the
    efficient kernel for float32, which cuDNN lacks), or FlashAttention where `AUTO_FROM` measured it faster
    for this card at this length (`lighthouse.flash_attn.auto_takes_flash_attn`); on CPU the flash kernel: it
    takes every float dtype, torch's ring rules take it, and it skips masked keys (the math kernel adds -inf to
    every score, so one NaN key turned the rows before it NaN too). Under `ring`, a backend without ring
    attention raises ValueError; so does a kernel for a device the inputs are not on."""
    if backend == "auto":
        if device.type != "cuda":
            return "flash"
        if auto_takes_flash_attn(device, dtype, length):
            return "flash_attn"
        return "cudnn" if dtype in (torch.bfloat16, torch.float16) else "efficient"
    if ring and backend not in RING_BACKENDS:
        raise ValueError(
            f"backend={backend!r} has no ring attention under context parallelism; use 'auto' or one of {RING_BACKENDS}"
        )
    if backend in CUDA_ONLY and device.type != "cuda":
        raise ValueError(f"backend={backend!r} needs CUDA inputs (they are on {device}); use 'auto', 'flash' or 'math'")
    if backend == "flash_attn":
        kernels = flash_attn_kernels()
        devices = kernels.devices if kernels is not None else ("cuda",)
        if device.type not in devices:
            raise ValueError(f"backend='flash_attn' needs {' or '.join(devices).upper()} inputs (they are on "
                             f"{device}); use 'auto', 'flash' or 'math'")
    return backend


def sdpa_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, name: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """q, k, v [B, S, heads, D] as SDPA takes them ([B, heads, S, D]), kv repeated to the query heads where
    the kernel `name` has no native GQA, and SDPA's `enable_gqa` flag."""
    heads = q.shape[2]
    if k.shape[2] != heads and name not in NATIVE_GQA:
        k, v = (x.repeat_interleave(heads // k.shape[2], dim=2) for x in (k, v))
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), k.shape[2] != heads


def heads_first_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, name: str, gqa: bool) -> torch.Tensor:
    """Causal attention, scale 1/sqrt(D), of the kernel `name` on `sdpa_inputs`' q [B, H, S, D], k/v [B, G, S, D]
    and flag -> [B, H, S, D]. DTensors sharded on S go through torch's ring attention."""
    if name == "flash_attn":
        return flash_attn_causal(q, k, v)
    with sdpa_kernel(SDPA_BACKENDS[name]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Causal softmax attention, scale 1/sqrt(D), on q [B, S, H, D], k/v [B, S, G, D] -> [B, S, H, D]."""
    name = resolve_backend(backend, q.device, q.dtype, length=q.shape[1])
    q, k, v, gqa = sdpa_inputs(q, k, v, name)
    return heads_first_causal(q, k, v, name, gqa).transpose(1, 2)


class DirectAttention(NamedTuple):
    """A causal SDPA kernel as two ops outside autograd, on [B, heads, S, D] (scale 1/sqrt(D)):
    forward(q, k, v, with_lse) -> (o, logsumexp, which may be empty without `with_lse`);
    backward(grad_o, q, k, v, o, logsumexp) -> (dq, dk, dv).
    `name`: the kernel's SDPA name (`sdpa_inputs` takes it to repeat kv where the kernel needs it)."""

    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor]]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    name: str


def _flash_attn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, with_lse: bool
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.lighthouse.flash_attn_forward(q, k, v, True)


def _flash_attn_backward(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                         lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ops.lighthouse.flash_attn_backward(grad_o, q, k, v, o, lse, True)


def direct_attention(backend: str, device: torch.device, dtype: torch.dtype, length: int | None = None
                     ) -> DirectAttention | None:
    """The forward and backward ops of the kernel `backend` resolves to here for `length` tokens, where they are
    wired up: cuDNN on CUDA (the default for bf16/fp16), the flash kernel on CPU and FlashAttention's ops; None
    for any other kernel (the caller goes through `causal_attention` and autograd). Each op is the one
    `causal_attention` reaches, without SDPA's dispatch, its autograd node and the `sdpa_kernel` context (on an
    H100 host, cuDNN's forward+backward on 1,536 gathered rows took 375 us of host time that way, 143 us called
    directly)."""
    name = resolve_backend(backend, device, dtype, length=length)
    if name == "cudnn" and device.type == "cuda":
        return DirectAttention(sdpa.cudnn_forward, sdpa.cudnn_backward, name)
    if name == "flash" and device.type == "cpu":
        return DirectAttention(sdpa.cpu_flash_forward, sdpa.cpu_flash_backward, name)
    if name == "flash_attn":
        return DirectAttention(_flash_attn_forward, _flash_attn_backward, name)
    return None
