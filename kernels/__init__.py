"""Fused Triton kernels for the Lighthouse layer, one module per pipeline stage (mirroring `lighthouse/`).

`fused_lighthouse_attention(q, k, v, config)` computes what `lighthouse.reference_lighthouse_attention`
computes; each stage's kernel is tested against its reference beside it (`kernels/test_<stage>.py`).
Submodules load on first use: Triton decides at import whether kernels run compiled or interpreted
(TRITON_INTERPRET=1), so importing this package alone must not build them.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["fused_lighthouse_attention", "supports"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".fused", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
