"""Stage 4b: stock causal attention on the gathered sub-sequence; no sparse index enters it (SPEC section 4)."""
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
_NATIVE_GQA = ("flash", "math")


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """'auto' and 'reference' mean cuDNN on CUDA (the efficient kernel for float32, which cuDNN lacks) and
    math elsewhere; other names pass through."""
    if backend in ("auto", "reference"):
        if device.type != "cuda":
            return "math"
        return "cudnn" if dtype in (torch.bfloat16, torch.float16) else "efficient"
    return backend


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """Causal softmax attention, scale 1/sqrt(D), on q [B, S, H, D], k/v [B, S, G, D] -> [B, S, H, D]."""
    name = resolve_backend(backend, q.device, q.dtype)
    if name == "flash_attn":
        return flash_attn_causal(q, k, v)
    heads, groups = q.shape[2], k.shape[2]
    if groups != heads and name not in _NATIVE_GQA:
        k, v = (x.repeat_interleave(heads // groups, dim=2) for x in (k, v))
    with sdpa_kernel(SDPA_BACKENDS[name]):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=k.shape[2] != heads
        )
    return out.transpose(1, 2)
