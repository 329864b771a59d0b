"""Asynchronous checkpoints (`--checkpoint.async_mode async`) get their manifests too: each asynchronous save's at the
first step boundary after its files are written, or at the next save or SIGTERM (which wait for them), the last
step's (saved synchronously) at once."""
import re
import signal
import subprocess
from pathlib import Path

import pytest

from recipe.launch import single_process_env
from recipe.logs.layout import read_metrics
from recipe.resilience.checkpoint_manifest import MANIFEST, manifest_faults, read_manifest

from .helpers import child_env, signal_when
from .warm_python import run_python, warm_job

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_asynchronous_save_of_a_finished_run_has_a_manifest_its_files_pass(tmp_path):
    run = run_python(["train.py", "--job.config_file", "configs/debug.toml", "--job.dump_folder", str(tmp_path),
                      "--training.steps", "6", "--checkpoint.enable", "--checkpoint.interval", "2",
                      "--checkpoint.async_mode", "async"],
                     env={**child_env(), **single_process_env(), "OMP_NUM_THREADS": "1"}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for step in (2, 4, 6):
        folder = str(tmp_path / "checkpoint" / f"step-{step}")
        manifest = read_manifest(folder)
        assert manifest is not None, f"step-{step} has no manifest"
        assert manifest_faults(folder, manifest) == [] and ".metadata" in manifest["files"]


@pytest.mark.slow
def test_sigterm_that_saves_nothing_still_completes_the_asynchronous_save_and_its_manifest(tmp_path):
    """Outside SLURM SIGTERM does not save (`save_on_sigterm = "auto"`); the newest asynchronous save, still
    being written or unverified when the signal comes, is waited for and gets its manifest, and the stop line
    names it as the step a restart resumes from."""
    env = {**child_env(), **single_process_env(), "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_JOB_ID", None)
    metrics = tmp_path / "metrics.jsonl"
    command, env = warm_job(["train.py", "--job.config_file", "configs/debug.toml", "--job.dump_folder", str(tmp_path),
                             "--training.steps", "1000", "--training.seq_len", "128", "--checkpoint.enable",
                             "--checkpoint.interval", "2", "--checkpoint.async_mode", "async",
                             "--checkpoint.keep_latest_k", "0"], env)
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = signal_when(job, lambda: metrics.exists() and '"step": 3,' in metrics.read_text(),  # after step 2's save
                         signal.SIGTERM)
    assert job.returncode == 143, err[-3000:]
    # the signal lands on a step that saved (asynchronously) or on one between saves
    match = re.fullmatch(r"stopped: terminated \(SIGTERM\) at step (\d+); (?:step \1 is saved|not saved "
                         r"\(\[resilience\] save_on_sigterm='auto' outside SLURM\)); a restart resumes from step-(\d+)",
                         err.splitlines()[-1])
    assert match, err[-3000:]
    newest = int(match.group(2))
    assert newest % 2 == 0 and newest >= 2
    saves = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "checkpoint").iterdir())
    assert saves[-1] == newest, "the newest save, asynchronous and unfinished at the signal, is complete"
    folder = str(tmp_path / "checkpoint" / f"step-{newest}")
    manifest = read_manifest(folder)
    assert manifest is not None and manifest_faults(folder, manifest) == [] and ".metadata" in manifest["files"]


@pytest.mark.slow
def test_an_asynchronous_save_gets_its_manifest_soon_after_its_files_so_a_killed_job_resumes_from_it(tmp_path):
    """The manifest comes at a step boundary once every rank's files are written, not at the next save: a job
    SIGKILLed between two saves resumes from the asynchronous one, verified."""
    env = {**child_env(), **single_process_env(), "OMP_NUM_THREADS": "1"}
    metrics, step_5 = tmp_path / "metrics.jsonl", tmp_path / "checkpoint" / "step-5"
    args = ["train.py", "--job.config_file", "configs/debug.toml", "--job.dump_folder", str(tmp_path),
            "--training.seq_len", "128", "--checkpoint.enable", "--checkpoint.interval", "5",
            "--checkpoint.async_mode", "async", "--metrics.log_freq", "1"]
    command, job_env = warm_job([*args, "--training.steps", "1000"], env)
    job = subprocess.Popen(command, cwd=REPO, env=job_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    signal_when(job, lambda: (step_5 / MANIFEST).exists(), signal.SIGKILL)
    logged = [r["step"] for r in read_metrics(str(metrics))]
    assert max(logged) < 10, "the manifest came with the next save, not before it"
    assert manifest_faults(str(step_5), read_manifest(str(step_5))) == []
    again = run_python([*args, "--training.steps", "6"], env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Training starts at step 6" in again.stdout + again.stderr and "damaged" not in again.stdout + again.stderr
