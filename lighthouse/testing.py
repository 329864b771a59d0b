"""Tolerances for comparing a fast path with the reference (like `torch.testing`): fla-style error ratios.

A fast path passes when RMSE(ref - fast) / RMS(ref) is under `ERROR_RATIO[dtype]`, or its absolute RMSE is
under `ABS_FLOOR` (outputs that are all but zero). The parity tests, the GPU parity check
(`eval/benchmarks/gpu_parity.py`) and the single-layer benchmark (`eval/benchmarks/attention_bench.py`) use the same
table.
"""
from __future__ import annotations

import torch

# Largest accepted RMSE(ref - fast) / RMS(ref), per dtype. bf16 is compared on GPU only: Triton's CPU
# interpreter truncates float32 -> bfloat16 casts instead of rounding to nearest, as the GPU does.
ERROR_RATIO = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 5e-3}
ABS_FLOOR = 1e-6  # below this absolute RMSE every comparison passes (fla's rule)


def error_ratio(ref: torch.Tensor, fast: torch.Tensor) -> tuple[float, float]:
    """(RMSE(ref - fast) / RMS(ref), RMSE(ref - fast)) in float64."""
    diff = (ref.double() - fast.double()).pow(2).mean().sqrt().item()
    return diff / max(ref.double().pow(2).mean().sqrt().item(), 1e-30), diff


def assert_close(name: str, ref: torch.Tensor, fast: torch.Tensor, dtype: torch.dtype) -> None:
    """Raise AssertionError naming `name` unless `fast` has `ref`'s shape, is finite, and its error ratio is
    under ERROR_RATIO[dtype] or its absolute RMSE under ABS_FLOOR."""
    assert ref.shape == fast.shape, f"{name}: shape {tuple(fast.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(fast).all(), f"{name}: non-finite values"
    ratio, rmse = error_ratio(ref, fast)
    assert rmse <= ABS_FLOOR or ratio <= ERROR_RATIO[dtype], f"{name}: error ratio {ratio:.2e} (rmse {rmse:.2e})"
