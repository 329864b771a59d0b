"""A step whose loss or gradient norm is NaN or infinite stops the job with one line naming it, before that
step's checkpoint is written, and so does a parameter, optimizer state entry or learning rate that is not
finite when a checkpoint is due: nothing non-finite is ever saved, the latest checkpoint stays the last good
one and a restart resumes from it (or, where that one is damaged, from the newest older one that loads)."""
import math
import os
import random
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import recipe  # noqa: F401  (before torchtitan)
from torchtitan.distributed import utils as dist_utils

from recipe.launch import single_process_env
from recipe.resilience.finite_guard import (FiniteGuard, NonFiniteStep, checkpoint_due, non_finite_state,
                                            recorded_grad_norms)

from .warm_python import run_python

REPO = Path(__file__).resolve().parent.parent


def test_the_first_non_finite_step_is_named_with_its_values_when_checked_and_finite_steps_pass():
    guard = FiniteGuard()
    for step in range(1, 4):
        guard.record(step, [torch.rand(()) + 1 for _ in range(3)], [torch.rand(()) * 5])  # three microbatches
    guard.check(3)
    bad = random.randint(4, 100)
    guard.record(bad, [torch.rand(()), torch.tensor(math.nan)], [torch.tensor(0.5)])
    guard.record(bad + 1, [torch.rand(())], [torch.tensor(math.inf)])  # a later bad step is not the one named
    with pytest.raises(NonFiniteStep, match=rf"^step {bad}: loss=nan, grad_norm=0\.5 is not finite; stopped at step "
                                            rf"{bad + 2} before saving it, so no checkpoint was saved \(a restart "
                                            r"starts over\)"):
        guard.check(bad + 2)
    only_norm = FiniteGuard()
    only_norm.record(7, [torch.rand(())], [torch.tensor(math.inf)])
    with pytest.raises(NonFiniteStep, match=r"^step 7: loss=[0-9.e-]+, grad_norm=inf is not finite"):
        only_norm.check(7)
    FiniteGuard().check(1)  # nothing recorded yet


def test_what_a_checkpoint_would_save_is_checked_entry_by_entry_and_named():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).square().sum().backward()
    optimizer.step()
    assert non_finite_state([model], [optimizer], [1e-3]) is None
    assert non_finite_state([model], [optimizer], [1e-3, math.nan]) == "the learning rate of parameter group 1 (lr=nan)"
    state = optimizer.state[model[1].bias]["exp_avg_sq"]
    state[random.randrange(state.numel())] = math.inf
    assert non_finite_state([model], [optimizer], [1e-3]) == "optimizer state exp_avg_sq of 1.bias"
    with torch.no_grad():
        model[0].weight[random.randrange(4), random.randrange(8)] = math.nan
    assert non_finite_state([model], [optimizer], [1e-3]) == "parameter 0.weight"  # parameters are named first


def test_the_guard_checks_on_the_steps_torchtitan_checkpoints():
    job = SimpleNamespace(training=SimpleNamespace(steps=20),
                          checkpoint=SimpleNamespace(enable=True, interval=5, enable_first_step_checkpoint=False))
    assert [s for s in range(1, 21) if checkpoint_due(job, s)] == [5, 10, 15, 20]
    job.checkpoint.enable_first_step_checkpoint = True
    assert [s for s in range(1, 21) if checkpoint_due(job, s)] == [1, 5, 10, 15, 20]
    job.checkpoint.enable = False
    assert not any(checkpoint_due(job, s) for s in range(1, 21))


def test_the_grad_norm_torchtitan_clips_with_is_recorded_and_the_function_restored():
    model = torch.nn.Linear(8, 4)
    model(torch.randn(5, 8)).square().sum().backward()
    expected = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    clip = dist_utils.clip_grad_norm_
    with recorded_grad_norms() as norms:
        returned = dist_utils.clip_grad_norm_(list(model.parameters()), max_norm=1e9)
    assert dist_utils.clip_grad_norm_ is clip
    assert len(norms) == 1 and norms[0] is returned
    assert torch.allclose(returned, expected)


# train.py, except that the gradient norm of the 5th step is NaN (as an overflow in the backward would make it).
NAN_AT_STEP_5 = """\
import math, runpy, torch
total_norm, calls = torch.nn.utils.get_total_norm, []
def nan_at_fifth(*args, **kwargs):
    calls.append(1)
    norm = total_norm(*args, **kwargs)
    return norm * math.nan if len(calls) == 5 else norm
torch.nn.utils.get_total_norm = nan_at_fifth
runpy.run_path("train.py", run_name="__main__")
"""


def run_6_steps(folder: Path, *program: str) -> subprocess.CompletedProcess:
    """`python <program>` (train.py or a wrapper of it) on the debug config for 6 steps into `folder`, saving every
    2nd step and logging step 1 only."""
    env = {**os.environ, **single_process_env(), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = ["--job.config_file", "configs/debug.toml", "--job.dump_folder", str(folder), "--training.steps", "6",
            "--training.seq_len", "128", "--checkpoint.interval", "2", "--metrics.log_freq", "100"]
    return run_python([*program, *args], env=env, timeout=300)


@pytest.mark.slow
def test_a_nan_step_stops_before_its_checkpoint_and_a_restart_resumes_from_the_newest_that_loads(tmp_path):
    folder = tmp_path / "run"
    # Step 5 is bad; step 6, the next one saved (no step is logged after step 1), finds it before saving.
    stopped = run_6_steps(folder, "-c", NAN_AT_STEP_5)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert stopped.stderr.splitlines()[-1].startswith("error: step 5: loss=")
    assert "grad_norm=nan is not finite; stopped at step 6 before saving it" in stopped.stderr.splitlines()[-1]
    assert "Traceback" not in stopped.stderr
    steps = sorted(p.name for p in (folder / "checkpoint").iterdir() if (p / ".metadata").exists())
    assert steps == ["step-2", "step-4"]
    (folder / "checkpoint" / "step-4" / ".metadata").write_bytes(os.urandom(512))  # and the newest is damaged
    resumed = run_6_steps(folder, "train.py")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{folder}/checkpoint/step-4 is damaged: .metadata holds 512 bytes, the save wrote " in resumed.stdout
    assert "Training starts at step 3" in resumed.stdout


# train.py, except that the 4th optimizer step runs with a NaN learning rate (the scheduler sets a finite one
# again right after): the loss and gradient norm of step 4 are finite, its updated weights are not.
NAN_UPDATE_AT_STEP_4 = """\
import math, runpy, torch
step, calls = torch.optim.AdamW.step, []
def nan_fourth(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 4:
        for group in self.param_groups:
            group["lr"] = math.nan
    return step(self, *args, **kwargs)
torch.optim.AdamW.step = nan_fourth
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_weights_made_non_finite_by_the_update_of_a_save_step_are_never_saved(tmp_path):
    folder = tmp_path / "run"
    stopped = run_6_steps(folder, "-c", NAN_UPDATE_AT_STEP_4)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert stopped.stderr.splitlines()[-1] == (
        "error: step 4: parameter tok_embeddings.weight is not finite; stopped before saving it, so the latest "
        "checkpoint is the last good one (step-2) (a lower optimizer.lr or training.max_norm may avoid it)")
    assert sorted(p.name for p in (folder / "checkpoint").iterdir()) == ["step-2"]
