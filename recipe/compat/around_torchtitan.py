"""Apply the CPU compatibility layer around torchtitan's import, in every process that imports `recipe`.

Why on import, where the recipe's other patches are explicit start-up calls: this layer's place is set by
torchtitan's import (without Triton, its stand-in must exist before torchtitan's package runs), not by the start of
a program, and only the import system knows that moment for every entry point (train.py, each script, a torchrun
rank, a notebook, a test process). A line per entry point was forgotten by three scripts. The finder imports
nothing, torch included, until torchtitan is imported, so the checks that run before the heavy imports stay fast.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any


class _TorchtitanLoader(importlib.abc.Loader):
    """torchtitan's own loader, with `after_torchtitan` run once its package has run."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        from recipe.compat import cpu

        module.__loader__ = module.__spec__.loader = self.loader  # the module keeps its own loader
        self.loader.exec_module(module)
        cpu.after_torchtitan()


class _TorchtitanFinder(importlib.abc.MetaPathFinder):
    """First on `sys.meta_path` until torchtitan is imported: runs `before_torchtitan`, then hands torchtitan's own
    spec on, loaded by `_TorchtitanLoader`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torchtitan":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        from recipe.compat import cpu

        cpu.before_torchtitan()
        spec.loader = _TorchtitanLoader(spec.loader)
        return spec


def install() -> list[str]:
    """Apply the layer (a no-op with an accelerator): at once if torchtitan is imported already, otherwise when it
    is; return the names of the patches applied so far."""
    if "torchtitan" in sys.modules:
        from recipe.compat import cpu

        return cpu.after_torchtitan()
    if not any(isinstance(finder, _TorchtitanFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchtitanFinder())
    return []
