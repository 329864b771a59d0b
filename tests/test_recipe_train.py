"""End-to-end runs of train.py on CPU: loss falls, resume is exact, the two-stage schedule and the one-run
switch agree, and FSDP runs on two gloo processes."""
import os
import re

import pytest

from lighthouse import LighthouseConfig
from recipe.compat.torchtitan import WAIT_LINE
from recipe.logs.layout import METRICS_FILE, read_metrics

from .helpers import torchrun, train_in_one_process

pytestmark = pytest.mark.slow  # every test trains or loads a model trained in this module

STEPS, HALF = 8, 4
# Every run: the debug config with one LR schedule over 8 steps, logged at every step.
COMMON = ["--job.config_file", "configs/debug.toml", "--lr_scheduler.total_steps", str(STEPS),
          "--metrics.log_freq", "1", "--checkpoint.interval", str(HALF)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run, one after another in a single process (one import), the jobs the tests compare:

    full: 8 Lighthouse steps; half: the first 4 with a full checkpoint, then resumed for steps 5..8
    without selection statistics;
    stage2: the step-4 checkpoint resumed with Lighthouse off; switch: 8 steps, dense after step 4, its host
    threads pinned to one CPU after step 1; interleaved: 6 steps with step 5 dense (`dense_every` 5).
    """
    root = tmp_path_factory.mktemp("runs")
    half_ckpt = root / "half" / "checkpoint" / f"step-{HALF}"
    jobs = {
        "full": ["--training.steps", str(STEPS)],
        "half": ["--training.steps", str(HALF), "--checkpoint.enable"],
        "half_resumed": ["--training.steps", str(STEPS), "--checkpoint.enable", "--lighthouse.no-log-stats"],
        "stage2": ["--training.steps", str(STEPS), "--checkpoint.enable", "--checkpoint.initial_load_path",
                   str(half_ckpt), "--checkpoint.no-initial-load-model-only", "--lighthouse.no-enable"],
        "switch": ["--training.steps", str(STEPS), "--lighthouse.switch_to_dense_at_step", str(HALF),
                   "--host.colocate_autograd"],
        "interleaved": ["--training.steps", str(HALF + 2), "--lighthouse.dense_every", str(HALF + 1)],
    }
    folder = {name: root / ("half" if name.startswith("half") else name) for name in jobs}
    argvs = [COMMON + ["--job.dump_folder", str(folder[name])] + extra for name, extra in jobs.items()]
    out = train_in_one_process(argvs)
    assert out.returncode == 0, out.stderr[-4000:]
    records = {name: read_metrics(str(folder[name] / METRICS_FILE))
               for name in ("full", "half", "stage2", "switch", "interleaved")}
    return records, out.stdout + out.stderr


def losses(records, steps):
    by_step = {r["step"]: r["loss_metrics/global_avg_loss"] for r in records}
    return [by_step[s] for s in steps]


def test_debug_run_loss_falls_and_logs_lighthouse_statistics_every_step(runs):
    records, _ = runs
    full = records["full"]
    assert [r["step"] for r in full] == list(range(1, STEPS + 1))
    first, last = losses(full, [1, STEPS])
    assert last < 0.75 * first
    config = LighthouseConfig(levels=3, pool=2, topk=32, tile_budget=16, selection="paper")  # configs/debug.toml
    for r in full:
        assert r["lighthouse/S"] == config.gathered_len(512)
        assert 0 < r["lighthouse/evenness_min/l1"] <= r["lighthouse/evenness/l1"] <= 1


def test_a_one_process_job_ends_without_torchtitans_wait_for_other_ranks(runs):
    _, log = runs
    assert log.count("Training completed") == 6 and WAIT_LINE not in log


def test_resuming_4_plus_4_steps_reproduces_the_uninterrupted_8(runs):
    records, log = runs
    half = records["half"]  # the resumed run appends steps 5..8 to the same metrics file
    assert [r["step"] for r in half] == list(range(1, STEPS + 1))
    assert losses(half, range(1, STEPS + 1)) == losses(records["full"], range(1, STEPS + 1))
    assert f"Training starts at step {HALF + 1}" in log


def test_log_stats_false_drops_the_statistics_and_leaves_training_unchanged(runs):
    records, _ = runs
    half = records["half"]
    assert all(("lighthouse/S" in r) == (r["step"] <= HALF) for r in half)
    assert losses(half, range(HALF + 1, STEPS + 1)) == losses(records["full"], range(HALF + 1, STEPS + 1))


def test_stage2_continues_step_lr_optimizer_and_data_with_dense_attention(runs):
    records, _ = runs
    stage2, full = records["stage2"], records["full"]
    assert [r["step"] for r in stage2] == list(range(HALF + 1, STEPS + 1))
    assert [r["lr"] for r in stage2] == [r["lr"] for r in full if r["step"] > HALF]
    assert not any(k.startswith("lighthouse/") for r in stage2 for k in r)
    assert losses(stage2, range(HALF + 1, STEPS + 1)) != losses(full, range(HALF + 1, STEPS + 1))


def test_switch_to_dense_at_step_gives_the_two_stage_losses(runs):
    records, _ = runs
    switch = records["switch"]
    assert losses(switch, range(1, HALF + 1)) == losses(records["full"], range(1, HALF + 1))
    # Same step-5..8 losses as a separate stage 2 means its data, optimizer state and LR continued.
    assert losses(switch, range(HALF + 1, STEPS + 1)) == losses(records["stage2"], range(HALF + 1, STEPS + 1))
    assert all(("lighthouse/S" in r) == (r["step"] <= HALF) for r in switch)


def test_dense_every_runs_only_its_steps_dense_and_returns_to_lighthouse(runs):
    records, _ = runs
    interleaved, full, switch = records["interleaved"], records["full"], records["switch"]
    assert losses(interleaved, range(1, HALF + 1)) == losses(full, range(1, HALF + 1))
    # Step 5 is dense on the weights of four Lighthouse steps: exactly the switched run's step 5.
    assert losses(interleaved, [HALF + 1]) == losses(switch, [HALF + 1])
    # Step 6 is Lighthouse again, on weights that differ from both runs' (one dense step in the past).
    assert losses(interleaved, [HALF + 2]) not in (losses(switch, [HALF + 2]), losses(full, [HALF + 2]))
    assert [("lighthouse/S" in r) for r in interleaved] == [True] * HALF + [False, True]


def test_colocated_host_threads_are_pinned_after_the_first_step(runs):
    records, log = runs
    assert re.search(r"\[host\] colocate_autograd: the training thread and \d+ autograd device thread\(s\) on "
                     r"CPU \d+ from step 2", log)
    assert log.count("[host] colocate_autograd:") == 1  # only the switch job asked
    # the switch job's losses equal the unpinned runs' (the test above): pinning moves threads, not numbers


def test_two_process_fsdp_on_gloo(tmp_path):
    out = torchrun(2, ["train.py", "--job.config_file", "configs/debug.toml", "--training.steps", "3",
                       "--job.dump_folder", str(tmp_path), "--validation.enable", "--validation.dataset", "synthetic",
                       "--validation.freq", "2", "--validation.steps", "1", "--validation.seq_len", "512",
                       "--host.colocate_autograd"])
    assert out.returncode == 0, out.stderr[-4000:]
    assert "Applied FSDP to the model" in out.stdout + out.stderr
    assert "outlive the process groups" not in out.stdout + out.stderr  # each rank joined its gloo workers
    assert WAIT_LINE in out.stdout + out.stderr  # rank 0 waits for rank 1: torchtitan's own line
    pinned = re.findall(r"colocate_autograd: .* on CPU (\d+) from step 2", out.stdout + out.stderr)
    assert len(pinned) == 2 and len(set(pinned)) == min(2, len(os.sched_getaffinity(0)))  # each rank its own CPU
    records = [r for r in read_metrics(str(tmp_path / METRICS_FILE)) if "loss_metrics/global_avg_loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    shadow = [r for r in read_metrics(str(tmp_path / METRICS_FILE)) if "validation/dense_loss" in r]
    assert [r["step"] for r in shadow] == [1, 2] and all(r["validation/lighthouse_loss"] > 0 for r in shadow)
    # The two ranks read different data, so the per-rank maximum exceeds the global mean.
    assert all(r["loss_metrics/global_max_loss"] > r["loss_metrics/global_avg_loss"] for r in records)
    assert records[-1]["loss_metrics/global_avg_loss"] < records[0]["loss_metrics/global_avg_loss"]
