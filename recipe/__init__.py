"""Trainer glue for Lighthouse on torchtitan, by layer (lowest first): `compat` (the compatibility layer),
`data`, `resilience`, `logs`, `hf`, `train` and `experiments` (docs/architecture.md).

Importing it installs the CPU compatibility layer (`recipe.compat.install`: a no-op with an accelerator), which
patches torchtitan around its import, so that no entry point has to remember a line for it.
"""
from recipe.compat import install

install()
