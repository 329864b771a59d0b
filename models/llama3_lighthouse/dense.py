"""The dense layers' causal attention with a backend (`[lighthouse] dense_backend`): torchtitan's SDPA module, whose
calls go to FlashAttention's op where the backend resolves to it (`lighthouse.attention.resolve_backend`).

"auto", the default, runs torchtitan's module itself (cuDNN first, its flash and math kernels where cuDNN does not
take the call) except where FlashAttention-4 is installed and was measured faster for the card at that length;
"cudnn" always keeps the stock module. Under context parallelism torchtitan's hooks hand the module
DTensors sharded on the sequence, which FlashAttention's op rings as SDPA's do.
"""
from __future__ import annotations

import torch
from torchtitan.models.attention import ScaledDotProductAttentionWrapper

from lighthouse.attention import heads_first_causal, resolve_backend
from lighthouse.config import resolve_kernels

DENSE_BACKENDS = ("cudnn", "flash_attn", "auto")


def check_dense_backend(backend: str) -> None:
    """ValueError naming the value unless `backend` is one of `DENSE_BACKENDS` whose kernels load here
    (`lighthouse.config.resolve_kernels`: FlashAttention-4 for "flash_attn")."""
    if backend not in DENSE_BACKENDS:
        raise ValueError(f"dense_backend={backend!r} is not one of {DENSE_BACKENDS}")
    resolve_kernels(backend)


class DenseAttention(ScaledDotProductAttentionWrapper):
    """torchtitan's causal SDPA module on q [B, H, N, D], k/v [B, G, N, D] with `backend` "flash_attn" (always
    FlashAttention) or "auto" (FlashAttention where `lighthouse.flash_attn.AUTO_FROM` measured it faster for
    this card at N, else the stock module); no parameters."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        check_dense_backend(backend)
        self.backend = backend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, enable_gqa: bool = False) -> torch.Tensor:
        if resolve_backend(self.backend, q.device, q.dtype, length=q.shape[2]) == "flash_attn":
            return heads_first_causal(q, k, v, "flash_attn", enable_gqa)
        return super().forward(q, k, v, enable_gqa=enable_gqa)

    def extra_repr(self) -> str:
        return f"backend={self.backend}"
