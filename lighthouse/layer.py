"""The public Lighthouse layer: input checks, the implementation `lighthouse.pipeline.resolve_implementation`
picks (the fused one as one autograd node, `lighthouse.fused_node`), and the `nn.Module` a model holds."""
from __future__ import annotations

from dataclasses import fields

import torch
from torch import nn

from .config import LighthouseConfig
from .inputs import check_config, check_inputs
from .pipeline import resolve_implementation
from .reference import reference_lighthouse_attention


def lighthouse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig) -> torch.Tensor:
    """Lighthouse attention on q [B, N, H, D], k/v [B, N, G, D] (after RoPE) -> o [B, N, H, D] in q's dtype.

    The fused kernels or the reference pipeline, as `resolve_implementation` decides.
    """
    check_config(config)
    check_inputs(q, k, v)
    config.validate(q.shape[1])
    if resolve_implementation(q, config) == "fused":
        from .fused_node import fused_lighthouse_attention

        return fused_lighthouse_attention(q, k, v, config)
    return reference_lighthouse_attention(q, k, v, config)


class LighthouseAttention(nn.Module):
    """Drop-in replacement for causal SDPA inside a model: forward(q, k, v) with [B, N, heads, D] layout."""

    def __init__(self, config: LighthouseConfig) -> None:
        super().__init__()
        check_config(config)
        self.config = config

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return lighthouse_attention(q, k, v, self.config)

    def extra_repr(self) -> str:
        return ", ".join(f"{f.name}={getattr(self.config, f.name)}" for f in fields(self.config))
