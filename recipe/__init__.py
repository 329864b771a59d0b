"""Trainer glue for Lighthouse on torchtitan: job config, tokenizer, data, metrics, dense-shadow validation,
run records and logs, sweeps, corpus building, and the compatibility layer (`recipe.compat`).

Importing it patches nothing: an entry point calls `recipe.compat.install()` first (a no-op with an accelerator).
"""
