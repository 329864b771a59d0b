"""The layer's one op in two implementations behind one interface: `plan` (scores and selection, no gradient)
then `attend` (gather, attention, scatter-back), pure PyTorch (`lighthouse.reference`) or the fused Triton
kernels (`lighthouse.fused`). Every caller composes the op through `pipeline_for`, on one device and per
context-parallel chunk alike; the fused module, which imports Triton, is loaded only where it runs.
"""
from __future__ import annotations

import os
from typing import Protocol

import torch

from . import reference
from .config import LighthouseConfig
from .scoring import CausalAttention, ScoreHistory
from .selection import Selection

FORCE_REFERENCE_ENV = "LIGHTHOUSE_FORCE_REFERENCE"


class Plan(Protocol):
    """What an implementation's `plan` returns, its own type (`reference.Plan`, `fused.Plan`); only its
    `attend` reads it, anyone may ask for the gathered set."""

    def selection(self, config: LighthouseConfig) -> Selection: ...


class Pipeline(Protocol):
    """`lighthouse.reference` or `lighthouse.fused`: the same two calls."""

    def plan(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig,
             prefixes: tuple[bool, ...] = (True,), scores: tuple[torch.Tensor, torch.Tensor] | None = None,
             history: ScoreHistory | None = None) -> Plan: ...

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, config: LighthouseConfig,
               spill: bool = False, attention: CausalAttention | None = None,
               out_dtype: torch.dtype | None = None) -> torch.Tensor: ...


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
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"implementation='fused' needs CUDA inputs (q is on {q.device}) or TRITON_INTERPRET=1 "
                         "(Triton's interpreter, for tests); use implementation='auto' or 'reference'")
    from .fused import check_supported, supports  # imports Triton: only where the kernels may run

    if config.implementation == "fused":
        check_supported(q, config)
        return "fused"
    return "fused" if supports(q, config) else "reference"


def pipeline_for(q: torch.Tensor, config: LighthouseConfig) -> Pipeline:
    """The implementation `resolve_implementation` names for this call, as a module with `plan` and `attend`.

    One level is dense attention, which the fused plan does not take (levels >= 2): the reference's `plan`
    (every token, in order) and `attend` compose it.
    """
    if config.levels > 1 and resolve_implementation(q, config) == "fused":
        from . import fused

        return fused
    return reference
