"""Pinning the caller and autograd's device threads to one CPU: which CPU, which threads, and undoing it."""
import os
import threading

import pytest
import torch

from lighthouse.host_threads import AUTOGRAD_THREAD_PREFIX, autograd_threads, colocated_autograd, pick_cpu

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread affinity is Linux-only")


def test_local_ranks_sharing_a_mask_get_distinct_cpus_spread_over_it_away_from_cpu_0():
    cpus = set(range(16))
    assert [pick_cpu(cpus, rank, 8) for rank in range(8)] == [1, 3, 5, 7, 9, 11, 13, 15]
    assert pick_cpu(cpus) == 8
    assert [pick_cpu({3, 5, 9}, rank, 3) for rank in range(3)] == [3, 5, 9]


def test_a_rank_bound_to_its_own_cpus_stays_inside_them():
    # SLURM / numactl gave rank 5 of 8 its own two CPUs
    assert pick_cpu({10, 11}, 5, 8) in {10, 11}
    assert pick_cpu({7}, 0, 1) == 7


def test_impossible_picks_name_the_values():
    with pytest.raises(ValueError, match="empty affinity mask"):
        pick_cpu(set())
    with pytest.raises(ValueError, match=r"local_rank=4 must be in \[0, local_world_size=4\)"):
        pick_cpu({0, 1}, 4, 4)


class NamedThread:
    """A thread that names itself (as autograd names its device threads) and waits until released."""

    def __init__(self, name: str):
        self.ready, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(name,))
        self.thread.start()
        self.ready.wait()

    def _run(self, name: str) -> None:
        self.tid = threading.get_native_id()
        with open(f"/proc/self/task/{self.tid}/comm", "w") as f:
            f.write(name)
        self.ready.set()
        self.release.wait()

    def stop(self) -> None:
        self.release.set()
        self.thread.join()


@pytest.fixture
def fake_autograd_thread():
    thread = NamedThread(f"{AUTOGRAD_THREAD_PREFIX}7")
    other = NamedThread("data_worker")
    yield thread, other
    thread.stop()
    other.stop()


def test_autograd_threads_are_found_by_name(fake_autograd_thread):
    autograd, other = fake_autograd_thread
    assert autograd.tid in autograd_threads()
    assert other.tid not in autograd_threads()


def test_the_caller_and_autograd_threads_share_one_cpu_inside_the_block_and_get_their_masks_back(fake_autograd_thread):
    autograd, other = fake_autograd_thread
    caller = threading.get_native_id()
    cpus = sorted(os.sched_getaffinity(caller))
    wanted = cpus[-1]
    before = {tid: os.sched_getaffinity(tid) for tid in (caller, autograd.tid, other.tid)}
    with colocated_autograd(wanted) as cpu:
        assert cpu == wanted
        assert os.sched_getaffinity(caller) == {wanted}
        assert os.sched_getaffinity(autograd.tid) == {wanted}
        assert os.sched_getaffinity(other.tid) == before[other.tid]  # only the threads that drive the device
        x = torch.randn(8, requires_grad=True)
        (grad,) = torch.autograd.grad((x * x).sum(), x)  # autograd still runs, on the one CPU
        torch.testing.assert_close(grad, 2 * x.detach())
    assert {tid: os.sched_getaffinity(tid) for tid in before} == before


def test_the_default_cpu_follows_torchrun_local_rank(monkeypatch, fake_autograd_thread):
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    picks = []
    for rank in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        with colocated_autograd() as cpu:
            picks.append(cpu)
    assert picks == [cpus[len(cpus) // 4], cpus[3 * len(cpus) // 4]]  # the middle of each rank's half
    assert len(cpus) < 2 or picks[0] != picks[1]  # also on 2 CPUs, where rank 1's pick is the default's


@pytest.mark.skipif(not torch.cuda.is_available(), reason="autograd starts device threads for CUDA only")
def test_on_cuda_the_real_device_threads_are_started_and_pinned():
    with colocated_autograd() as cpu:
        threads = autograd_threads()
        assert threads
        assert all(os.sched_getaffinity(tid) == {cpu} for tid in threads)
