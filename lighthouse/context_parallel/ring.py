"""Ring attention over a sequence sharded head/tail: torch's context-parallel SDPA on DTensors, turned on and
set up through `lighthouse.compat.context_parallel` (where its private calls are)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from ..attention import heads_first_causal, resolve_backend, sdpa_inputs
from ..compat.context_parallel import (
    CPU_FLASH_PAIR,
    SEQ_DIM,
    enable_ring_dispatch,
    load_balanced,
    register_ring_attention,
    set_ring_options,
    set_rotate_method,
)
from ..scoring import CausalAttention


def enable_context_parallel(cp_mesh: DeviceMesh, rotate_method: str) -> None:
    """Turn on ring attention for `cp_mesh`'s device (FlashAttention's ops' handlers, and the CPU flash op's on a
    CPU mesh) and set how k/v rotate ("allgather" or "alltoall"); torchtitan 0.2.2 ignores
    `parallelism.context_parallel_rotate_method` in training, so this sets it."""
    pairs = [(torch.ops.lighthouse.flash_attn_forward.default, torch.ops.lighthouse.flash_attn_backward.default)]
    if cp_mesh.device_type == "cpu":
        pairs.append(CPU_FLASH_PAIR)
    register_ring_attention(pairs)
    set_rotate_method(rotate_method)
    enable_ring_dispatch(cp_mesh.device_type)


@contextmanager
def ring_options(*, float32_merge: bool = True, load_balance: bool = True,
                 rotate_method: str = "allgather") -> Iterator[None]:
    """Run with torch's ring settings changed (tests: float64 merges, a layout without load balancing, the
    alltoall rotation); the defaults are restored on exit."""
    set_ring_options(float32_merge, load_balance, rotate_method)
    try:
        yield
    finally:
        set_ring_options(True, True, "allgather")


def _check_head_tail_layout() -> None:
    if not load_balanced():
        raise ValueError(
            "Lighthouse context parallelism needs the head/tail sequence layout, but torch's ring attention is set "
            "to no load balancing (torchtitan: parallelism.context_parallel_load_balancer must be 'headtail')"
        )


def ring_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mesh: DeviceMesh, backend: str = "auto"
) -> torch.Tensor:
    """Causal attention over a sequence sharded head/tail on `mesh`: local q [B, S, H, D], k/v [B, S, G, D] ->
    [B, S, H, D].

    The local tensors are wrapped as DTensors sharded on the sequence dim, so torch's context-parallel
    dispatcher runs its ring attention (rotation set by `enable_context_parallel`); scale 1/sqrt(D). `auto`
    chooses the kernel by the whole sequence's length, as on one device.
    """
    name = resolve_backend(backend, q.device, q.dtype, ring=True, length=q.shape[1] * mesh.size())
    enable_ring_dispatch(q.device.type)
    _check_head_tail_layout()
    q, k, v, gqa = sdpa_inputs(q, k, v, name)
    qd, kd, vd = (DTensor.from_local(x, mesh, [Shard(SEQ_DIM)], run_check=False) for x in (q, k, v))
    return heads_first_causal(qd, kd, vd, name, gqa).to_local().transpose(1, 2)


def ring_scorer_attention(mesh: DeviceMesh) -> CausalAttention:
    """Causal ring attention on [B*, H, S, D] for the dilated scorer's two float32 attentions ('auto': the
    efficient kernel on CUDA, which takes float32, the flash kernel on CPU)."""

    def ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        return ring_causal_attention(q, k, v, mesh).transpose(1, 2)

    return ring
