"""Inner attention through the flash-attn package (`backend = "flash_attn"`), on the gathered sub-sequence.

Takes the first implementation that imports, fastest first: FlashAttention-3 (`flash_attn_interface`,
Hopper), FlashAttention-4 (`flash_attn.cute`, Hopper and Blackwell), FlashAttention-2 (`flash_attn`).
All take [B, S, H, D] with fewer kv heads than query heads (GQA) natively and scale by 1/sqrt(D).
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

# (module, human name), in order of preference
IMPLEMENTATIONS = (
    ("flash_attn_interface", "FlashAttention-3"),
    ("flash_attn.cute", "FlashAttention-4"),
    ("flash_attn", "FlashAttention-2"),
)


def load_flash_attn() -> tuple[str, Callable]:
    """(name, flash_attn_func) of the first flash-attn implementation that imports; RuntimeError if none."""
    errors = []
    for module, name in IMPLEMENTATIONS:
        try:
            return name, importlib.import_module(module).flash_attn_func
        except (ImportError, AttributeError) as err:
            errors.append(f"{module}: {err}")
    raise RuntimeError(
        "backend='flash_attn' needs the flash-attn package (the flash extra: pip install -e '.[flash]', or "
        "FlashAttention-3's flash_attn_interface); none of these imported: " + "; ".join(errors)
        + ". Use backend='cudnn' or 'auto' for torch SDPA."
    )


def flash_attn_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention on q [B, S, H, D], k/v [B, S, G, D] -> [B, S, H, D] with flash-attn."""
    _, fn = load_flash_attn()
    out = fn(q, k, v, causal=True)
    return out[0] if isinstance(out, tuple) else out  # some versions also return the log-sum-exp
