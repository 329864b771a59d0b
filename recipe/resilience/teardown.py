"""End torch.distributed after a job so that no gloo worker thread outlives its process group.

A gloo group runs each collective on a worker thread (`pt_gloo_runloop`) that drops the finished work object
itself, and a work can hold tensors that Python created. If the group is still alive when the interpreter
exits, a worker that drops such a work after finalization has begun asks for the GIL, Python ends the thread
from under C++, and the process aborts with "terminate called without an active exception" (SIGABRT, no
Python frame). It happened on CPU runs with two processes, more often on a loaded machine.

`destroy_process_group` joins a group's workers only when the group object itself goes away, and torch's
DTensor caches and the trainer's device meshes keep it alive. So the trainer is released first, then those
caches, and the groups are destroyed with nothing else holding them: their workers are joined before the
interpreter exits.
"""
from __future__ import annotations

import gc
import sys

import torch
from torchtitan.tools.logging import logger

from lighthouse.host_threads import threads_named

from recipe.compat.dtensor import release_dtensor_caches

GLOO_WORKER_THREAD = "pt_gloo_runloop"


def gloo_workers() -> int:
    """How many gloo worker threads this process runs (0 where /proc is missing)."""
    if not sys.platform.startswith("linux"):
        return 0
    return len(threads_named(GLOO_WORKER_THREAD))


def end_process_groups(finished: bool) -> None:
    """Destroy every process group, after a barrier if every rank finished (a rank that failed would never
    reach it); warn if gloo workers outlive the groups, since the exit may then abort. Call it after the last
    reference to the trainer is gone."""
    if not torch.distributed.is_initialized():
        return
    release_dtensor_caches()
    gc.collect()  # both collections are needed: without either, a two-rank CPU run kept its gloo workers
    if finished:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    gc.collect()
    if left := gloo_workers():
        logger.warning(f"{left} gloo worker thread(s) outlive the process groups: something still holds a group, "
                       "and the exit may abort (SIGABRT)")
