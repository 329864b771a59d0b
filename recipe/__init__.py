"""Trainer glue for Lighthouse on torchtitan: job config, tokenizer, data, metrics, dense-shadow validation,
run records and logs, sweeps, corpus building, CPU compatibility.

Importing this package first applies the CPU compatibility layer (a no-op with an accelerator), so it
must be imported before torchtitan.
"""
from .cpu_compat import install as _install_cpu_compat

_install_cpu_compat()
