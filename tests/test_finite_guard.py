"""A step whose loss or gradient norm is NaN or infinite stops the job with one line naming it, before that
step's checkpoint is written; the latest checkpoint stays the last good one and a restart resumes from it (or,
where that one is damaged, from the newest older one that loads)."""
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import recipe  # noqa: F401  (before torchtitan)
from torchtitan.distributed import utils as dist_utils

from recipe.finite_guard import NonFiniteStep, check_finite_step, recorded_grad_norms
from recipe.launch import single_process_env

REPO = Path(__file__).resolve().parent.parent


def test_finite_steps_pass_and_a_nan_loss_or_infinite_norm_is_named_with_its_step():
    losses = [torch.rand(()) + 1 for _ in range(3)]  # three microbatches
    check_finite_step(7, losses, [torch.rand(()) * 5])
    step = random.randint(1, 10_000)
    with pytest.raises(NonFiniteStep, match=rf"^step {step}: loss=nan, grad_norm=0\.5 is not finite; stopped before "
                                            rf"saving step {step}, so the latest checkpoint is the last good one"):
        check_finite_step(step, [losses[0], torch.tensor(math.nan)], [torch.tensor(0.5)])
    with pytest.raises(NonFiniteStep, match=rf"^step {step}: loss=[0-9.]+, grad_norm=inf is not finite"):
        check_finite_step(step, losses, [torch.tensor(math.inf)])


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


# train.py, except that the gradient norm of the 3rd step is NaN (as an overflow in the backward would make it).
NAN_AT_STEP_3 = """\
import math, runpy, torch
total_norm, calls = torch.nn.utils.get_total_norm, []
def nan_at_third(*args, **kwargs):
    calls.append(1)
    norm = total_norm(*args, **kwargs)
    return norm * math.nan if len(calls) == 3 else norm
torch.nn.utils.get_total_norm = nan_at_third
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_a_nan_step_stops_before_its_checkpoint_and_a_restart_resumes_from_the_newest_that_loads(tmp_path):
    folder = tmp_path / "run"
    env = {**os.environ, **single_process_env(), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = ["--job.config_file", "configs/debug.toml", "--job.dump_folder", str(folder), "--training.steps", "4",
            "--training.seq_len", "256", "--checkpoint.interval", "1"]

    def run(*program: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *program, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)

    stopped = run("-c", NAN_AT_STEP_3)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert stopped.stderr.splitlines()[-1].startswith("error: step 3: loss=")
    assert "grad_norm=nan is not finite; stopped before saving step 3" in stopped.stderr.splitlines()[-1]
    assert "Traceback" not in stopped.stderr
    steps = sorted(p.name for p in (folder / "checkpoint").iterdir() if (p / ".metadata").exists())
    assert steps == ["step-1", "step-2"]
    (folder / "checkpoint" / "step-2" / ".metadata").write_bytes(os.urandom(512))  # and the newest is damaged
    resumed = run("train.py")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{folder}/checkpoint/step-2 cannot be loaded (" in resumed.stdout
    assert "Training starts at step 2" in resumed.stdout
