"""Stage 4b: stock causal attention on the gathered sub-sequence; no sparse index enters it (SPEC section 4).

The one place that turns `LighthouseConfig.backend` into an SDPA kernel (`resolve_backend`) and decides
whether kv heads are repeated for it (`sdpa_inputs`); context parallelism's ring attention uses both.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .flash_attn import flash_attn_causal

SDPA_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# Backends whose SDPA takes fewer kv heads than query heads directly (enable_gqa); others get repeated kv.
NATIVE_GQA = ("flash", "math")
# Backends torch's context-parallel dispatcher rings (the math backend has no ring rule).
RING_BACKENDS = ("cudnn", "flash", "efficient")


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype, ring: bool = False) -> str:
    """The SDPA kernel `backend` means here. 'auto' is cuDNN on CUDA (the efficient kernel for float32,
    which cuDNN lacks); on CPU the math kernel, or for ring attention (`ring`) the CPU flash kernel, the
    only one torch's ring rules take. Under `ring`, a backend without ring rules raises ValueError."""
    if backend == "auto":
        if device.type == "cuda":
            return "cudnn" if dtype in (torch.bfloat16, torch.float16) else "efficient"
        return "flash" if ring else "math"
    if ring and backend not in RING_BACKENDS:
        raise ValueError(
            f"backend={backend!r} has no ring attention under context parallelism; use 'auto' or one of {RING_BACKENDS}"
        )
    return backend


def sdpa_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, name: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """q, k, v [B, S, heads, D] as SDPA takes them ([B, heads, S, D]), kv repeated to the query heads where
    the kernel `name` has no native GQA, and SDPA's `enable_gqa` flag."""
    heads = q.shape[2]
    if k.shape[2] != heads and name not in NATIVE_GQA:
        k, v = (x.repeat_interleave(heads // k.shape[2], dim=2) for x in (k, v))
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), k.shape[2] != heads


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Causal softmax attention, scale 1/sqrt(D), on q [B, S, H, D], k/v [B, S, G, D] -> [B, S, H, D]."""
    name = resolve_backend(backend, q.device, q.dtype)
    if name == "flash_attn":
        return flash_attn_causal(q, k, v)
    q, k, v, gqa = sdpa_inputs(q, k, v, name)
    with sdpa_kernel(SDPA_BACKENDS[name]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return out.transpose(1, 2)
