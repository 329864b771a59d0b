"""The private parts of Triton and torch the kernels' launch path relies on (`lighthouse_kernels.launch.launch`), in one
place: a compiled kernel's launcher and its calling convention (Triton 3.6-3.7), the current raw CUDA stream, the
launch hooks and a JIT function's parameters."""
from __future__ import annotations

from typing import Any

import torch
from triton import knobs
from triton.runtime.jit import JITFunction


def is_jit_function(kernel: Any) -> bool:
    """Whether `kernel` is a compiled-mode `@triton.jit` function (not the interpreter's)."""
    return isinstance(kernel, JITFunction)


def launch_hooks_set() -> bool:
    """Whether a launch hook is set (an empty `HookChain`, Triton's default, is none)."""
    return any(hook is not None and getattr(hook, "calls", True)
               for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def constexpr_values(kernel: JITFunction, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
    """The values of the kernel's parameters after the positional `args`, in order, when they are all
    constexprs given by keyword and no positional one is a constexpr (the launches `run_compiled` can
    repeat); None otherwise."""
    rest = kernel.params[len(args):]
    if all(p.is_constexpr and p.name in kwargs for p in rest) and not any(
            p.is_constexpr for p in kernel.params[:len(args)]):
        return tuple(kwargs[p.name] for p in rest)
    return None


def run_compiled(compiled: Any, grid: tuple[int, ...], device: int, args: tuple, constexprs: tuple) -> None:
    """Launch a compiled kernel on the current CUDA stream of `device` through its launcher, without Triton's
    per-call argument binding."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    compiled.run(*grid, torch._C._cuda_getCurrentRawStream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *constexprs)
