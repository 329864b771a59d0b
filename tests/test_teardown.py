"""recipe.resilience.teardown: at the end of a job no gloo worker thread outlives its process group, even after DTensor
ops filled torch's caches with the device mesh (a worker still running at interpreter exit can abort the
process with SIGABRT)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from recipe.launch import free_port

from .helpers import REPO, child_env

JOB = """
import sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from recipe.resilience import teardown

dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
x = distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)])
(x @ x.T).redistribute(mesh, [Replicate()]).full_tensor()
print("workers while running", teardown.gloo_workers())
del mesh, x
if sys.argv[2] == "keep-caches":
    teardown.release_dtensor_caches = lambda: None
teardown.end_process_groups(finished=True)
print("workers after", teardown.gloo_workers())
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads are counted in /proc")


def run_job(caches: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", JOB, str(free_port()), caches], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=120)


def test_the_groups_workers_are_joined_before_the_interpreter_exits():
    out = run_job("release")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "workers while running 2" in out.stdout  # gloo's default: two worker threads per group
    assert "workers after 0" in out.stdout
    assert "outlive" not in out.stderr


def test_caches_that_keep_the_mesh_leave_the_workers_running_and_say_so():
    out = run_job("keep-caches")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "workers after 2" in out.stdout
    assert "2 gloo worker thread(s) outlive the process groups" in out.stderr
