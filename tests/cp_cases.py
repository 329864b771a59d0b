"""Context-parallel test cases and inputs shared by the reference (test_context_parallel.py) and fused
(test_context_parallel_fused.py) CP tests."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest
import torch

from lighthouse import LighthouseConfig
from lighthouse.context_parallel import owned_chunks

from .helpers import vectors_with_norms

F64 = torch.float64
PARITY = {
    # id: (config, seq_len, heads, kv_heads, dtype, tolerance)
    "L3-p2-k16-m4-MHA": (
        LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=4, selection="paper"), 256, 4, 4, F64, 1e-12
    ),
    "L3-p4-k8-m2-GQA-halo15": (
        LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="paper"), 256, 4, 2, F64, 1e-12
    ),
    # causal scores of a chunk's first entries read the previous chunk's last 15 tokens (another rank's)
    "L3-p4-k8-m2-GQA-causal": (
        LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="causal"), 256, 4, 2, F64, 1e-12
    ),
    # strict: the same trailing scores and history, and the online rule within each tile
    "L3-p4-k8-m2-GQA-strict": (
        LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="strict"), 256, 4, 2, F64, 1e-12
    ),
    "L4-p2-k8-m2-MQA": (
        LighthouseConfig(levels=4, pool=2, topk=8, tile_budget=2, selection="paper"), 256, 4, 1, F64, 1e-12
    ),
    "L3-p2-dilated": (
        LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=4, scorer="dilated", selection="paper"),
        256, 4, 2, F64, 1e-12
    ),
    "L1-dense": (LighthouseConfig(levels=1, pool=2, topk=4, tile_budget=2, selection="paper"), 128, 4, 2, F64, 1e-12),
    "L3-p2-float32": (
        LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=4, selection="paper"), 256, 4, 2, torch.float32, 2e-5
    ),
}

# Selection configs: both scorers, the paper's, the causal and the strict selection.
NORM = LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=4, selection="paper")
DILATED = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=2, scorer="dilated", selection="paper")
NORM_CAUSAL = LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="causal")
DILATED_CAUSAL = dataclasses.replace(DILATED, selection="causal")
NORM_STRICT = dataclasses.replace(NORM_CAUSAL, selection="strict")
DILATED_STRICT = dataclasses.replace(DILATED, selection="strict")


def strict_cases_slow(cases: list) -> list:
    """Parametrize values with the strict selection's cases marked slow (each launches a group of ranks; the
    fast loop keeps the other modes' cases). A case is an id of PARITY, a config, or a tuple starting with one."""
    def strict(case) -> bool:
        config = PARITY[case][0] if isinstance(case, str) else case[0] if isinstance(case, tuple) else case
        return config.selection == "strict"
    return [pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=pytest.mark.slow) if strict(c) else c
            for c in cases]


def shard_positions(rank: int, cp_degree: int, seq_len: int) -> torch.Tensor:
    """Positions of the rank's head and tail chunks, in local order."""
    chunk = seq_len // (2 * cp_degree)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for c in owned_chunks(rank, cp_degree)])


def rising_norm_inputs(
    seq_len: int, heads: int, kv_heads: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (float64, batch 2, dim 8) whose norms grow with position, and a random v: the first entry of
    every tile scores lowest."""
    torch.manual_seed(seed)
    norms = torch.arange(1, seq_len + 1, dtype=torch.float64).view(1, seq_len, 1).expand(2, seq_len, heads)
    q = vectors_with_norms(norms, 8)
    k = vectors_with_norms(norms[..., :kv_heads], 8)
    return q, k, torch.randn_like(k)


@contextlib.contextmanager
def fused_plans() -> Iterator[list[int]]:
    """The calls of the fused pipeline's `plan` inside (one per chunk planned on the fused kernels): a check of
    "fused" against "reference" that never reached the kernels would compare the reference with itself."""
    from lighthouse import fused  # the Triton kernels: the reference CP tests import this module without them

    calls, original = [], fused.plan
    fused.plan = lambda *args, **kwargs: (calls.append(1), original(*args, **kwargs))[1]
    try:
        yield calls
    finally:
        fused.plan = original
