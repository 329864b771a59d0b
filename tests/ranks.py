"""A pool of CPU ranks in one gloo group, for tests of context parallelism (the `ranks` fixture of conftest.py).

The worker processes start once per test session; each test sends them a check to run on a mesh of degree
`world` or 1 (each rank alone). A check is a module-level function (spawn pickles it by name); one that
changes torch's ring settings does so through `lighthouse.context_parallel.ring_options`, which restores the
defaults, so no test's settings reach the next one.
"""
from __future__ import annotations

import multiprocessing as std_mp
import os
import queue
import shutil
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lighthouse.context_parallel import enable_context_parallel

TASK_TIMEOUT_S = 120


def _worker(rank: int, world: int, rendezvous: str, tasks: std_mp.Queue, results: std_mp.Queue) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    meshes = {world: init_device_mesh("cpu", (world,))}
    alone = [dist.new_group([r]) for r in range(world)]  # every rank takes part in creating every group
    meshes[1] = DeviceMesh.from_group(alone[rank], "cpu")
    enable_context_parallel(meshes[world], "allgather")
    while (task := tasks.get()) is not None:
        check, degree, args = task
        try:
            check(meshes[degree], *args)
            results.put((rank, None))
        except BaseException:
            results.put((rank, traceback.format_exc()))
    dist.destroy_process_group()


class RankPool:
    """`world` processes in one gloo group; `run(check, degree, *args)` calls check(mesh, *args) on every rank."""

    def __init__(self, world: int) -> None:
        self.stopped: str | None = None  # why the pool stopped, after a rank failed to answer
        ctx = mp.get_context("spawn")
        self.tasks = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        # A file of its own to meet in, not a TCP port: a port picked free can be taken by another job before the
        # group binds it.
        self.folder = tempfile.mkdtemp(prefix="rank-pool-")
        rendezvous = os.path.join(self.folder, "rendezvous")
        self.procs = [
            ctx.Process(target=_worker, args=(r, world, rendezvous, self.tasks[r], self.results), daemon=True)
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def run(self, check: Callable[..., None], degree: int, *args) -> None:
        """Run `check(mesh, *args)` on every rank's mesh of size `degree`; fail the test with every rank's traceback.

        A rank that does not answer stops the pool (the group cannot go on without it): later tests fail at once.
        """
        if self.stopped is not None:
            pytest.fail(f"the rank pool stopped in an earlier test: {self.stopped}")
        for t in self.tasks:
            t.put((check, degree, args))
        failures = []
        for _ in self.tasks:
            try:
                rank, error = self.results.get(timeout=TASK_TIMEOUT_S)
            except queue.Empty:
                self.stopped = f"a rank did not answer within {TASK_TIMEOUT_S} s"
                self.close()
                pytest.fail(self.stopped)
            if error is not None:
                failures.append(f"rank {rank}:\n{error}")
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)

    def close(self) -> None:
        """Stop the workers (killing one that does not exit within 30 s)."""
        for t in self.tasks:
            t.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        shutil.rmtree(self.folder, ignore_errors=True)
