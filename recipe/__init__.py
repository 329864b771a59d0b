"""Trainer glue for Lighthouse on torchtitan: job config, tokenizer, data, metrics, dense-shadow validation,
run records and logs, sweeps, corpus building, CPU compatibility.

Importing this package applies the CPU compatibility layer (`cpu_compat`, a no-op with an accelerator). With
Triton installed the import may come before or after torchtitan's (the layer repoints what torchtitan bound
at import); without Triton it must come first, since torchtitan itself imports Triton unless the layer's
stand-in for its MoE kernels is registered.
"""
from .cpu_compat import install as _install_cpu_compat

_install_cpu_compat()
