"""Trainer glue for Lighthouse on torchtitan, by layer (lowest first): `compat` (the compatibility layer),
`data`, `resilience`, `logs`, `hf`, `train` and `experiments` (docs/architecture.md).

Importing it patches nothing: an entry point calls `recipe.compat.install()` first (a no-op with an accelerator).
"""
