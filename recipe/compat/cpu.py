"""Make torchtitan 0.2.2 run on a machine without an accelerator (debugging and CI).

Active only when torch sees no accelerator; on a GPU machine it changes nothing. `recipe.compat.install` (which
`import recipe` calls) applies it around torchtitan's import: `before_torchtitan` (1) just before torchtitan's package
runs, `after_torchtitan` (the rest) just after. Each patch fixes one fact about torchtitan 0.2.2 + torch 2.13 on CPU:

1. `import torchtitan` imports triton (through `torchtitan.models.moe.kernels`); CPU wheels of torch do not
   ship triton. If triton cannot be imported, a stand-in for that module is registered; it raises if an
   MoE token permutation is ever requested (the dense Llama of this recipe never does).
2. `torchtitan.tools.utils.device_type` falls back to "cuda" without a GPU. It and the modules that copied
   it at import time are pointed at "cpu".
3. `DeviceMemoryMonitor` calls `torch.cpu` functions that do not exist (`get_device_name`,
   `get_device_properties`, `memory_stats`, ...). `CpuDeviceModule` provides them: peak memory is the
   process's peak resident set size, capacity the machine's physical memory.
4. `set_pg_timeouts` calls `barrier(device_ids=[device_module.current_device()])`, which is the string
   'cpu' for `torch.cpu`; `CpuDeviceModule.current_device()` returns the index 0 instead.
5. FSDP2 reduces gradients with `ReduceOp.PREMUL_SUM`, which gloo rejects. `force_sum_reduction` is
   applied by the model's parallelize function on CPU (see `models/llama3_lighthouse/parallelize.py`).
6. Ring attention (context parallel) has no sharding rule for the CPU flash op
   `aten._scaled_dot_product_flash_attention_for_cpu`. `lighthouse.compat.context_parallel.register_ring_attention`
   adds one built from torch's own ring templates; `enable_context_parallel` registers it when the CP
   mesh is on CPU.

Warnings that say nothing on CPU are silenced (`quiet_cpu_warnings`):

7. torchtitan looks up the peak FLOPs of the GPU for MFU: it runs `lspci` to find an NVIDIA H100 and, not
   knowing the device, falls back to an A100's 312 TFLOPS, warning about both on every run. Without a GPU
   the lookup has nothing to find; one line says instead that the `mfu` column means nothing here.
8. With `training.mixed_precision_param = "float32"` torchtitan enters `torch.autocast("cpu", float32)`,
   which torch rejects with a warning and turns off: float32 autocast changes nothing, so neither does
   dropping the warning.
9. A job of several CPU ranks (gloo) warns on every rank that DTensor's random operators and `manual_seed`
   "may not have complete support on cpu device mesh" (torch tracks RNG offsets for CUDA meshes only; a CPU
   run is for debugging, not for matching a GPU run's initialisation), that "Set timeout is now only
   supported for either nccl or gloo" (a CPU mesh's sub-groups keep their default timeout), and torchtitan
   that `ENV[TORCH_NCCL_...]` will be overridden (NCCL settings, unused without a GPU).
"""
from __future__ import annotations

import importlib
import logging
import os
import platform
import re
import resource
import sys
import types
import warnings
from typing import Any

import torch
from torch._utils import _get_available_device_type

MOE_KERNELS_MODULE = "torchtitan.models.moe.kernels"
# Modules of torchtitan that bind `device_type` / `device_module` at import time.
DEVICE_BINDING_MODULES = (
    "torchtitan.tools.utils",
    "torchtitan.tools.profiling",
    "torchtitan.components.metrics",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.dual_pipe_v",
)


def on_cpu_only() -> bool:
    """True when torch sees no accelerator, i.e. torchtitan would (wrongly) assume CUDA."""
    return _get_available_device_type() is None


def triton_importable() -> bool:
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def _moe_kernels_unavailable(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "MoE token permutation needs triton, which is not installed; the Lighthouse Llama model never calls it"
    )


def stub_moe_kernels() -> None:
    """(1) Register a triton-free stand-in for `torchtitan.models.moe.kernels` before torchtitan is imported."""
    if MOE_KERNELS_MODULE in sys.modules:
        return
    stub = types.ModuleType(MOE_KERNELS_MODULE, "Stand-in without triton: MoE kernels are unavailable.")
    stub.__all__ = ["generate_permute_indices", "fill_indices_wrapper"]
    stub.generate_permute_indices = _moe_kernels_unavailable
    stub.fill_indices_wrapper = _moe_kernels_unavailable
    sys.modules[MOE_KERNELS_MODULE] = stub


class CpuDeviceModule:
    """(3, 4) `torch.cpu` plus the CUDA-style functions torchtitan calls on its device module."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(device: Any) -> None:
        """There is one CPU device; every rank uses it."""

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return f"CPU {platform.processor() or platform.machine()}"

    @staticmethod
    def get_device_properties(device: Any = None) -> types.SimpleNamespace:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return types.SimpleNamespace(name=CpuDeviceModule.get_device_name(), total_memory=total)

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        """Peak resident set size of this process, reported as both active and reserved peak."""
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak, "num_alloc_retries": 0, "num_ooms": 0}

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        """The kernel's peak RSS cannot be reset, so CPU peaks are since process start."""

    @staticmethod
    def empty_cache() -> None:
        """The CPU allocator keeps no cache to release."""


def point_torchtitan_at_cpu() -> None:
    """(2) Make every torchtitan module that bound the device at import time use "cpu" and `CpuDeviceModule`."""
    device_module = CpuDeviceModule()
    for name in DEVICE_BINDING_MODULES:
        module = importlib.import_module(name)
        module.device_type = "cpu"
        module.device_module = device_module


# (9) Warnings of torch about a CPU mesh of gloo ranks, which say nothing about a CPU debugging run.
CPU_MESH_WARNINGS = (
    "DTensor random operators may not have complete support on cpu device mesh",
    "DTensor manual_seed() may not have complete support on cpu device mesh",
    "Set timeout is now only supported for either nccl or gloo.",
)


class CpuLogFilter(logging.Filter):
    """(7) Drops torchtitan's peak-FLOPs warnings, which are about finding a GPU, and explains MFU once;
    (9) drops its notes on NCCL environment variables."""

    MFU_NOTE = "MFU on CPU: torchtitan knows no CPU peak and divides by an A100's 312 TFLOPS; ignore the mfu column"

    def __init__(self) -> None:
        super().__init__()
        self.explained = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(("Error running lspci", "ENV[TORCH_NCCL_")):
            return False
        if message.startswith("Peak flops undefined for"):
            if self.explained:
                return False
            self.explained = True
            record.msg, record.args, record.levelno, record.levelname = self.MFU_NOTE, (), logging.INFO, "INFO"
        return True


def ignore_float32_autocast_warning() -> None:
    """(8) Ignore torch's warning that CPU autocast does not support the dtype (float32: nothing to autocast)."""
    warnings.filterwarnings("ignore", message="In CPU autocast, but the target dtype is not supported",
                            category=UserWarning)


def ignore_cpu_mesh_warnings() -> None:
    """(9) Ignore torch's warnings about DTensor randomness and group timeouts on a CPU mesh."""
    for message in CPU_MESH_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=UserWarning)


def quiet_cpu_warnings() -> None:
    """(7, 8, 9) Install the log filter on torchtitan's (root) logger and ignore the warnings that say nothing
    on CPU."""
    logging.getLogger().addFilter(CpuLogFilter())
    ignore_float32_autocast_warning()
    ignore_cpu_mesh_warnings()


_installed: list[str] = []


def before_torchtitan() -> None:
    """(1) What must be in place before torchtitan's package runs."""
    if on_cpu_only() and not triton_importable():
        stub_moe_kernels()
        _installed.append("moe_kernels_without_triton")


def after_torchtitan() -> list[str]:
    """(2-4, 7-9) What needs torchtitan's modules, once: they are pointed at the CPU, its warnings quieted; the names
    of the patches applied."""
    if "device_cpu" not in _installed and on_cpu_only():
        point_torchtitan_at_cpu()
        _installed.append("device_cpu")
        quiet_cpu_warnings()
    return list(_installed)
