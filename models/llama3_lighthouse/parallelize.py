"""FSDP2, activation checkpointing, torch.compile (and TP) from torchtitan's Llama-3, plus the CPU/gloo fix."""
from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torchtitan.distributed import ParallelDims
from torchtitan.models.llama3 import parallelize_llama
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from lighthouse import LighthouseAttention
from lighthouse.context_parallel import ContextParallelLighthouseAttention, enable_context_parallel


def force_sum_reduction(model: nn.Module) -> None:
    """Make FSDP reduce gradients with plain SUM: gloo rejects the PREMUL_SUM that FSDP2 uses by default."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def parallelize_lighthouse_attention(model: nn.Module, cp_mesh: DeviceMesh) -> int:
    """Replace every `LighthouseAttention` in `model` by `ContextParallelLighthouseAttention` on `cp_mesh`.

    Returns how many were replaced. Apply torchtitan's `apply_cp_to_attention_module` to the dense layers'
    SDPA modules only: its hooks would hand a Lighthouse layer DTensors instead of local shards.
    """
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, LighthouseAttention) and not isinstance(child, ContextParallelLighthouseAttention)
    ]
    for parent, name, child in targets:
        setattr(parent, name, ContextParallelLighthouseAttention(child.config, cp_mesh))
    return len(targets)


def parallelize_lighthouse_llama(model: nn.Module, parallel_dims: ParallelDims, job_config) -> nn.Module:
    """torchtitan's `parallelize_llama`; on CPU (gloo) FSDP is switched to SUM reductions.

    Lighthouse layers add no parameters and keep the stock module names, so TP plans, the AC policy and
    per-block compile apply unchanged. Under context parallelism, each Lighthouse call becomes its
    context-parallel version (selection on owned chunks, ring attention over the gathered sub-sequence,
    halo exchange); torchtitan's CP hooks stay on the dense SDPA modules.
    """
    if parallel_dims.cp_enabled:
        cp_mesh = parallel_dims.get_mesh("cp")
        swapped = parallelize_lighthouse_attention(model, cp_mesh)
        logger.info(f"Applied context parallel to {swapped} Lighthouse layers (degree {cp_mesh.size()})")
        enable_context_parallel(cp_mesh, job_config.parallelism.context_parallel_rotate_method)
    model = parallelize_llama(model, parallel_dims, job_config)
    if utils.device_type == "cpu" and parallel_dims.fsdp_enabled:
        force_sum_reduction(model)
    return model
