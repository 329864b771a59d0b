"""The checks of what a Lighthouse entry point is given: q [B, N, H, D], k/v [B, N, G, D] of one floating dtype
and device, non-empty, with H a multiple of G, and a LighthouseConfig; a mistake is named here, not deep inside
a kernel."""
from __future__ import annotations

import torch

from .config import LighthouseConfig

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_config(config: object) -> None:
    """Raise TypeError unless `config` is a LighthouseConfig."""
    if not isinstance(config, LighthouseConfig):
        raise TypeError(f"config must be a LighthouseConfig, not {type(config).__name__}")


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, needs_v: bool = True) -> None:
    """Raise TypeError (not tensors, or not of a dtype in `DTYPES`) or ValueError (v missing where `needs_v`, shapes,
    empty dimensions, dtypes or devices that differ) naming the values if q [B,N,H,D] and k/v [B,N,G,D] don't fit
    together."""
    if v is None and needs_v:
        raise ValueError("v is None: Lighthouse attention needs the values v [B, N, G, D] beside q and k")
    given = {"q": q, "k": k} if v is None else {"q": q, "k": k, "v": v}
    for name, x in given.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(x).__name__}")
        if x.dtype not in DTYPES:  # float8 included: its scores and pooling have no arithmetic in torch
            raise TypeError(f"{name} has dtype {x.dtype}; Lighthouse takes float16, bfloat16, float32 or float64")
    if any(x.dim() != 4 for x in given.values()):
        raise ValueError(f"q, k, v must be 4-D [B, N, heads, D]; got {_shapes(given)}")
    if any(0 in x.shape for x in given.values()):
        raise ValueError(f"q, k, v must have no empty dimension (B, N, heads, D >= 1); got {_shapes(given)}")
    if v is not None and k.shape != v.shape:
        raise ValueError(f"k{tuple(k.shape)} and v{tuple(v.shape)} must have the same shape")
    (b, n, h, d), (bk, nk, g, dk) = q.shape, k.shape
    if (b, n, d) != (bk, nk, dk):
        raise ValueError(f"q{tuple(q.shape)} and k{tuple(k.shape)} must agree on batch, sequence and head dim")
    if h % g != 0:
        raise ValueError(f"query heads H={h} must be a multiple of kv heads G={g}")
    if any(x.dtype != q.dtype for x in given.values()):
        raise ValueError("q, k, v dtypes differ: " + ", ".join(str(x.dtype) for x in given.values()))
    if any(x.device != q.device for x in given.values()):
        raise ValueError("q, k, v devices differ: " + ", ".join(str(x.device) for x in given.values()))


def _shapes(given: dict[str, torch.Tensor]) -> str:
    """`q(2, 8, 4, 16), k(...)`, built only for a message: Dynamo cannot trace `str.join` over symbolic sizes,
    which a recompile with dynamic shapes (a validation batch of another size) gives it."""
    return ", ".join(f"{name}{tuple(x.shape)}" for name, x in given.items())
