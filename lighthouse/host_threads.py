"""Pin the calling thread and autograd's device threads to one CPU, for layers whose host time bounds them.

Autograd runs a CUDA backward on its own thread per device (`pt_autograd_<i>`) while the caller waits. When
the two threads sit on different cores, each forward+backward pays two cross-core wake-ups, and the
backward's Python runs on a core whose caches hold none of the caller's objects. On a KVM guest with an
H200 the fused layer's host time at N=8K went 0.92 -> 0.58 ms per forward+backward with both threads on
one core; pinning them to two different cores did not help. But the one CPU's own speed then bounds that
host work, and on shared virtual machines it differs between CPUs and runs: on two H100 guests the 8K
benchmark was no faster, once slower (docs/benchmarks.md, round 6). Opt-in for that reason. Linux only.

A thread the pinned caller starts afterwards inherits its one CPU (subprocesses too): pin after start-up
work that wants every core, such as torch.compile's compile workers.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

import torch

AUTOGRAD_THREAD_PREFIX = "pt_autograd_"


def thread_names() -> dict[int, str]:
    """Native thread id -> name of this process's threads (from /proc; threads that end meanwhile are skipped)."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[int(tid)] = f.read().strip()
        except OSError:
            continue
    return names


def threads_named(prefix: str) -> list[int]:
    """Native ids of this process's threads whose name starts with `prefix`."""
    return sorted(tid for tid, name in thread_names().items() if name.startswith(prefix))


def autograd_threads() -> list[int]:
    """Native ids of autograd's device threads, started by a first backward that involves a device."""
    return threads_named(AUTOGRAD_THREAD_PREFIX)


def start_autograd_threads() -> None:
    """Start autograd's device threads with one tiny backward on the current CUDA device (no-op on CPU)."""
    if torch.cuda.is_available():
        x = torch.ones(1, device="cuda", requires_grad=True)
        torch.autograd.grad(x * 2, x, torch.ones_like(x))


def pick_cpu(allowed: set[int], local_rank: int = 0, local_world_size: int = 1) -> int:
    """The CPU for one process's pinned threads: the middle of this local rank's equal share of the CPUs the
    node's local ranks see (a per-rank binding from SLURM or numactl leaves each its own set). The middle,
    not the first: CPU 0 takes most of a host's interrupts."""
    if not allowed:
        raise ValueError("no CPU is allowed to this process (empty affinity mask)")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank={local_rank} must be in [0, local_world_size={local_world_size})")
    cpus = sorted(allowed)
    return cpus[(2 * local_rank + 1) * len(cpus) // (2 * local_world_size)]


@contextmanager
def colocated_autograd(cpu: int | None = None) -> Iterator[int]:
    """Within the block, the calling thread and autograd's device threads run on one CPU (`cpu`, default
    `pick_cpu` of this process's mask with torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE); yields that CPU. Each
    thread's earlier mask comes back on exit."""
    start_autograd_threads()
    caller = threading.get_native_id()
    if cpu is None:
        cpu = pick_cpu(os.sched_getaffinity(caller), int(os.environ.get("LOCAL_RANK", 0)),
                       int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    earlier = {tid: os.sched_getaffinity(tid) for tid in [caller, *autograd_threads()]}
    try:
        for tid in earlier:
            os.sched_setaffinity(tid, {cpu})
        yield cpu
    finally:
        for tid, mask in earlier.items():
            try:
                os.sched_setaffinity(tid, mask)
            except ProcessLookupError:  # the thread ended meanwhile
                continue
