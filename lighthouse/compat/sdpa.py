"""The SDPA kernels' own forward and backward aten ops, on [B, heads, S, D], causal, scale 1/sqrt(D), no
dropout: what `F.scaled_dot_product_attention` reaches, called without its dispatch and autograd node
(`lighthouse.attention.direct_attention`). These ops are private to torch; their argument lists are torch
2.11-2.13's."""
from __future__ import annotations

import torch


def cudnn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, with_lse: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, with_lse, 0.0, True, False)
    return out[0], out[1]


def cudnn_backward(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # no dropout: the philox seed and offset are not read; dense rows: no cumulative lengths
    s = q.shape[2]
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        grad_o, q, k, v, o, lse, None, None, None, None, None, s, s, 0.0, True)


def cpu_flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, with_lse: bool
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)


def cpu_flash_backward(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_o, q, k, v, o, lse, 0.0, True)
