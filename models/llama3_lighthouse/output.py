"""The output layer that can own the loss: logits, or with `labels` the per-token nats of the fused output loss.

A `nn.Linear` (same parameter, same name `output.weight`), so checkpoints, the HF adapter and torchtitan's
parallelize plans see stock Llama-3. Its forward takes the labels so that the fused loss (`linear_cross_entropy`)
runs inside the module's forward, where FSDP2 has gathered the weight: a loss reading the sharded parameter
outside a module forward would see a shard.
"""
from __future__ import annotations

import torch
from torch import nn

from models.linear_cross_entropy import linear_cross_entropy


class OutputLayer(nn.Linear):
    """hidden [B, T, D] -> logits [B, T, V]; with `labels` [B, T], per-token nats [B, T] (float32, 0 at ignored
    labels), `chunk_tokens` tokens of logits at a time."""

    def __init__(self, dim: int, vocab_size: int, chunk_tokens: int = 2048, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(dim, vocab_size, bias=False, device=device, dtype=dtype)
        self.chunk_tokens = chunk_tokens

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if labels is None:
            return super().forward(hidden)
        return linear_cross_entropy(hidden, self.weight, labels, self.chunk_tokens)
