"""FlashAttention-4's own forward and backward (`flash_attn.cute.interface`), which `lighthouse.flash_attn`'s ops
call: its public `flash_attn_func` is an autograd.Function, so a custom op's backward cannot reach it. Both are
private to the package; their argument lists are flash-attn-4 4.0.0b36's (the `flash` extra's pin)."""
from __future__ import annotations

import importlib

import torch

NAME = "FlashAttention-4"
MODULE = "flash_attn.cute.interface"


def load_forward_backward() -> tuple:
    """(forward, backward) of FlashAttention-4 on q [B, S, H, D], k/v [B, S_k, G, D]; ImportError (or
    AttributeError) where the package or one of its calls is missing."""
    interface = importlib.import_module(MODULE)
    fwd, bwd = interface._flash_attn_fwd, interface._flash_attn_bwd

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse, *_ = fwd(q, k, v, causal=causal, return_lse=True)
        return out, lse

    def backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(bwd(q, k, v, out, grad_out, lse, causal=causal)[:3])

    return forward, backward
