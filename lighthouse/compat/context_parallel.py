"""torch's context-parallel dispatcher, whose ring attention `lighthouse.context_parallel.ring` uses: every
private torch call of the project's context parallelism.

torch rings SDPA on DTensors sharded along the sequence once its CP dispatcher is on. It rings only the CUDA SDPA ops
(flash, efficient, cuDNN). On CPU, SDPA runs
`aten._scaled_dot_product_flash_attention_for_cpu`, for which it has neither a handler nor a sharding rule,
so `register_ring_attention` adds the two missing handlers (forward and backward), built from torch's
own ring templates exactly as torch builds its CUDA flash handlers: no new collective, the same head/tail
load balancing and LSE merge. CPU rings serve tests and debugging on gloo. FlashAttention's ops
(`lighthouse::flash_attn_forward`, `_backward`) get the same two handlers, on every device.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._utils import compute_global_tensor_info
from torch.distributed.tensor.experimental._attention import (
    _cp_options,
    _enable_context_parallel_dispatcher,
    set_rotate_method,
)
from torch.distributed.tensor.experimental._context_parallel import _attention as torch_cp

aten = torch.ops.aten
CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
CPU_FLASH_PAIR = (CPU_FLASH, CPU_FLASH_BACKWARD)
_RING_OPS = {"cpu": CPU_FLASH, "cuda": aten._scaled_dot_product_flash_attention.default}
SEQ_DIM = 2  # torch's ring attention shards [B, H, S, D] on S


def _bind(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Every argument of `op` by name, defaults filled in."""
    bound = {}
    for i, arg in enumerate(op._schema.arguments):
        bound[arg.name] = args[i] if i < len(args) else kwargs.get(arg.name, arg.default_value)
    return bound


def _local_shards(bound: dict[str, Any], names: tuple[str, ...]) -> tuple[DeviceMesh, list[torch.Tensor]]:
    """The mesh and local tensors of the named DTensor arguments; each must be sharded on the sequence dim."""
    tensors = [bound[name] for name in names]
    for name, t in zip(names, tensors):
        if not isinstance(t, DTensor) or t.device_mesh.ndim != 1 or tuple(t.placements) != (Shard(SEQ_DIM),):
            placement = tuple(t.placements) if isinstance(t, DTensor) else type(t).__name__
            raise NotImplementedError(
                f"CPU ring attention needs {name} as a DTensor on a 1-D mesh sharded Shard({SEQ_DIM}); got {placement}"
            )
    return tensors[0].device_mesh, [t._local_tensor for t in tensors]


def _sharded(mesh: DeviceMesh, local: torch.Tensor) -> DTensor:
    """Wrap a local result as a DTensor sharded on the sequence dim, as the CP sharding rules do on CUDA."""
    shape, stride = compute_global_tensor_info(local, mesh, [Shard(SEQ_DIM)])
    spec = DTensorSpec(mesh, (Shard(SEQ_DIM),), tensor_meta=TensorMeta(torch.Size(shape), tuple(stride), local.dtype))
    return DTensor(local, spec, requires_grad=False)


def _options(bound: dict[str, Any]) -> dict[str, Any]:
    """The op's arguments besides q, k, v and causality that the ring passes through (the SDPA ops' dropout and
    scale; FlashAttention's ops have none)."""
    return {name: bound[name] for name in ("dropout_p", "scale") if name in bound}


def _ring_forward(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[DTensor, DTensor]:
    """Handler of an attention forward returning (out, logsumexp): torch's ring template around the same op on
    the local shards."""
    bound = _bind(op_call, args, kwargs)
    if bound.get("attn_mask") is not None:
        raise NotImplementedError("ring attention here takes no attn_mask (causal attention only)")
    mesh, (q, k, v) = _local_shards(bound, ("query", "key", "value"))
    out, lse = torch_cp._templated_ring_attention(
        mesh.get_group(), SEQ_DIM, op_call, query=q, key=k, value=v, is_causal=bound["is_causal"], **_options(bound),
    )
    return _sharded(mesh, out), _sharded(mesh, lse)


def _ring_backward(op_call: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[DTensor, ...]:
    """Handler of the matching backward: torch's ring backward template around the same op on the local shards."""
    bound = _bind(op_call, args, kwargs)
    names = ("grad_out", "query", "key", "value", "out", "logsumexp")
    mesh, (grad_out, q, k, v, out, lse) = _local_shards(bound, names)
    grads = torch_cp._templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, op_call, grad_out=grad_out, grad_out_name="grad_out",
        query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=bound["is_causal"], **_options(bound),
    )
    return tuple(_sharded(mesh, g) for g in grads[:3])


def register_ring_attention(pairs: list[tuple[torch._ops.OpOverload, torch._ops.OpOverload]]) -> None:
    """Let torch's context-parallel dispatcher ring each (forward, backward) pair of attention ops (idempotent):
    the forward returns (out, logsumexp) and both take torch's ring templates' argument names, as the CPU flash
    ops (`CPU_FLASH_PAIR`) and FlashAttention's do.

    The handlers join torch's CP handler table, so they are active exactly while the CP dispatcher is; if
    it is already on, they are added to the live table too.
    """
    handlers = {}
    for forward, backward in pairs:
        handlers[forward], handlers[backward] = _ring_forward, _ring_backward
    torch_cp.custom_ops.update(handlers)
    live = DTensor._op_dispatcher._custom_op_handlers
    if aten._scaled_dot_product_flash_attention.default in live:
        live.update(handlers)


def enable_ring_dispatch(device_type: str) -> None:
    """Turn on torch's context-parallel SDPA dispatcher where it is off; it must stay on through backward.

    Where it is on already this only reads: torch.compile refuses a write to the dispatcher inside the
    activation-checkpoint HOP ("HOP: Unsafe side effect"), and a layer under full activation checkpointing
    calls this on every forward.
    """
    op = _RING_OPS.get(device_type)
    if op is None:
        raise ValueError(
            f"ring attention has no rule for device type {device_type!r}; expected one of {tuple(_RING_OPS)}"
        )
    if op not in DTensor._op_dispatcher._custom_op_handlers:
        _enable_context_parallel_dispatcher()
    if op not in DTensor._op_dispatcher._custom_op_handlers:
        raise RuntimeError(
            f"torch's context-parallel dispatcher has no rule for {op}: call enable_context_parallel(mesh, ...) first"
        )


def set_ring_options(float32_merge: bool, load_balance: bool, rotate_method: str) -> None:
    """Set torch's ring settings: float32 LSE merges, head/tail load balancing, how k/v rotate ("allgather" or
    "alltoall")."""
    _cp_options.convert_to_f32, _cp_options.enable_load_balance = float32_merge, load_balance
    set_rotate_method(rotate_method)


def load_balanced() -> bool:
    """Whether torch's ring attention expects the head/tail sequence layout."""
    return _cp_options.enable_load_balance
