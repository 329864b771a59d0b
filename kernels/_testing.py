"""Shared helpers of the kernel parity tests: where kernels run, fresh inputs, fla-style error ratios."""
from __future__ import annotations

import torch

from lighthouse import pyramid_index, pyramid_scores

from .ordering import slot_map
from .selection import select_packed, selection_of

# Kernels run on CUDA, or on the CPU through Triton's interpreter (conftest.py sets TRITON_INTERPRET=1).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# Largest accepted RMSE(ref - fast) / RMS(ref), per dtype. bf16 is compared on GPU only: Triton's CPU
# interpreter truncates float32 -> bfloat16 casts instead of rounding to nearest, as the GPU does.
ERROR_RATIO = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 5e-3}
ABS_FLOOR = 1e-6  # below this absolute RMSE every comparison passes (fla's rule)
CPU_DTYPES = (torch.float32, torch.float16)


def error_ratio(ref: torch.Tensor, fast: torch.Tensor) -> tuple[float, float]:
    """(RMSE(ref - fast) / RMS(ref), RMSE(ref - fast)) in float64."""
    diff = (ref.double() - fast.double()).pow(2).mean().sqrt().item()
    return diff / max(ref.double().pow(2).mean().sqrt().item(), 1e-30), diff


def assert_close(name: str, ref: torch.Tensor, fast: torch.Tensor, dtype: torch.dtype) -> None:
    """fla-style check: the error ratio under ERROR_RATIO[dtype], or an absolute RMSE under ABS_FLOOR."""
    assert ref.shape == fast.shape, f"{name}: shape {tuple(fast.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(fast).all(), f"{name}: non-finite values"
    ratio, rmse = error_ratio(ref, fast)
    assert rmse <= ABS_FLOOR or ratio <= ERROR_RATIO[dtype], f"{name}: error ratio {ratio:.2e} (rmse {rmse:.2e})"


def random_qkv(batch: int, seq_len: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype,
               requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh standard-normal q [B,N,H,D], k, v [B,N,G,D] on DEVICE."""
    shapes = ((batch, seq_len, heads, dim), (batch, seq_len, kv_heads, dim), (batch, seq_len, kv_heads, dim))
    return tuple(torch.randn(s, device=DEVICE, dtype=dtype).requires_grad_(requires_grad) for s in shapes)


def random_selection(batch: int, kv_heads: int, seq_len: int, config):
    """(packed, slots, flat_index) of a selection drawn from fresh random scores: the kernels' gather order,
    its inverse map, and the reference's index into the concatenated pyramid."""
    sq, sk = (torch.cat(pyramid_scores(torch.rand(batch, kv_heads, seq_len, device=DEVICE), config.pool,
                                       config.levels), dim=-1) for _ in range(2))
    packed = select_packed(sq, sk, seq_len, config)
    flat = pyramid_index(selection_of(packed, config), seq_len, config.pool, config.levels)
    return packed, slot_map(packed, seq_len, config.pool, config.levels), flat
