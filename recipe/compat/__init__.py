"""Every private torchtitan and torch call of the recipe, and its patches, in one place.

- `cpu`: the CPU compatibility layer for torchtitan 0.2.2 (patches, a no-op with an accelerator), applied around
  torchtitan's import by `install` (`around_torchtitan`), which `import recipe` calls;
- `torchtitan`: the ConfigManager hooks the recipe overrides and the rank that logs metrics;
- `dtensor`: emptying torch's DTensor caches at the end of a job (`recipe.resilience.teardown`).

No entry point has a line of its own for the layer: importing any part of `recipe` (or `eval`, which imports it)
installs it, and it costs nothing until torchtitan is imported. The private torch calls of the algorithm are in
`lighthouse/compat.py`, those of the kernels' launch path in `lighthouse_kernels/compat.py`.
"""
from recipe.compat.around_torchtitan import install

__all__ = ["install"]
