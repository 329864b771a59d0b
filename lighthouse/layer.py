"""The public Lighthouse layer: input checks, the one choice between the fused and the reference pipeline,
and the `nn.Module` a model holds."""
from __future__ import annotations

import os
from dataclasses import fields

import torch
from torch import nn

from .config import LighthouseConfig
from .inputs import check_config, check_inputs
from .reference import reference_lighthouse_attention

FORCE_REFERENCE_ENV = "LIGHTHOUSE_FORCE_REFERENCE"


def resolve_implementation(q: torch.Tensor, config: LighthouseConfig) -> str:
    """'fused' or 'reference': the pipeline that runs this call (single device and context parallel alike).

    `implementation="auto"` takes the fused Triton kernels for CUDA inputs they support, else the reference;
    "fused" raises ValueError where the kernels do not apply (on CPU it needs TRITON_INTERPRET=1);
    LIGHTHOUSE_FORCE_REFERENCE=1 in the environment forces the reference whatever the config says.
    """
    if config.implementation == "reference" or os.environ.get(FORCE_REFERENCE_ENV) == "1":
        return "reference"
    if config.implementation == "auto" and not q.is_cuda:
        return "reference"
    from .fused import check_supported, supports  # imports Triton: only where the kernels may run

    if config.implementation == "fused":
        check_supported(q, config)
        return "fused"
    return "fused" if supports(q, config) else "reference"


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
