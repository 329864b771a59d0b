"""Every private torchtitan and torch call of the recipe, and its patches, in one place.

- `cpu`: the CPU compatibility layer for torchtitan 0.2.2 (patches, applied by `install`, a no-op with an
  accelerator);
- `torchtitan`: the ConfigManager hooks the recipe overrides and the rank that logs metrics;
- `dtensor`: emptying torch's DTensor caches at the end of a job (`recipe.resilience.teardown`).

Nothing is patched on import: an entry point (`train.py`, the scripts, the test session) calls `install()`
first, before it imports torchtitan (without Triton, torchtitan imports only after the layer's stand-in for
its MoE kernels is registered). The private torch calls of the algorithm are in `lighthouse/compat.py`, those
of the kernels' launch path in `kernels/compat.py`.
"""
from recipe.compat.cpu import install

__all__ = ["install"]
