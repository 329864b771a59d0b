"""The SLURM scripts, run on CPU against fake `srun`, `scontrol` and `sbatch` executables on PATH.

The fakes record their argument vectors, so the tests check the exact command lines the scripts build:
the torchrun launch (nodes, GPUs, c10d rendezvous on the first host, job id, config, overrides), the
self-requeue on the time-limit signal, and the stage chain with `--dependency=afterok`.
"""
from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from recipe.launch import free_port

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*REPO.glob("slurm/*.sbatch"), *REPO.glob("slurm/*.sh"), *REPO.glob("scripts/*.sh")])

FAKE_SRUN = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$FAKE_LOG/srun.args"
echo $$ > "$FAKE_LOG/srun.pid"
exec sleep "${FAKE_SRUN_SLEEP:-0}"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG/scontrol.log"
if [[ $1 == show && $2 == hostnames ]]; then printf '%s\\n' $FAKE_HOSTS; fi
"""
FAKE_SBATCH = """#!/usr/bin/env bash
n=$(( $(ls "$FAKE_LOG" | grep -c '^sbatch') + 1 ))
printf '%s\\0' "$@" > "$FAKE_LOG/sbatch.$n.args"
echo "$(( FAKE_FIRST_JOB + n - 1 ));cluster0"
"""


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def cluster(tmp_path):
    """A throw-away repository root with the SLURM scripts, a train.py and a config, and fake SLURM tools."""
    repo = tmp_path / "repo"
    (repo / "slurm").mkdir(parents=True)
    for script in ("train.sbatch", "submit.sh"):
        shutil.copy2(REPO / "slurm" / script, repo / "slurm" / script)
    (repo / "train.py").write_text("")
    (repo / "configs").mkdir()
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("sbatch", FAKE_SBATCH)):
        _write_executable(bin_dir / name, text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RDZV_", "GPUS_PER_NODE", "LH_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", FAKE_LOG=str(log_dir))
    return repo, log_dir, env


def _job_env(env: dict, repo: Path, nnodes: int, hosts: list[str], job_id: int, **extra: str) -> dict:
    return {
        **env,
        "SLURM_SUBMIT_DIR": str(repo),
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NAME": "stage1",
        "SLURM_NNODES": str(nnodes),
        "SLURM_JOB_NODELIST": f"gpu-[{hosts[0][4:]}-{hosts[-1][4:]}]",
        "FAKE_HOSTS": " ".join(hosts),
        **extra,
    }


def _read_args(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")[:-1]


def _hosts(rng: random.Random, n: int) -> list[str]:
    first = rng.randrange(100, 900)
    return [f"gpu-{first + i}" for i in range(n)]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_passes_shellcheck(script):
    result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("nnodes,gpus", [(1, 8), (4, 8), (2, 4)], ids=lambda v: str(v))
def test_launch_line(cluster, nnodes, gpus):
    repo, log, env = cluster
    rng = random.Random(nnodes * 100 + gpus)
    hosts, job_id, cpus = _hosts(rng, nnodes), rng.randrange(10**5, 10**6), rng.choice([32, 96, 112])
    (repo / "configs" / "run.toml").write_text("")
    overrides = ["--training.steps", str(rng.randrange(10, 10**4)), "--lighthouse.topk=2048"]
    job_env = _job_env(env, repo, nnodes, hosts, job_id, SLURM_GPUS_ON_NODE=str(gpus), SLURM_CPUS_PER_TASK=str(cpus))
    result = subprocess.run(
        ["bash", str(repo / "slurm/train.sbatch"), "configs/run.toml", *overrides],
        cwd="/", env=job_env, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert (log / "scontrol.log").read_text().split("\n")[0] == f"show hostnames {job_env['SLURM_JOB_NODELIST']}"
    assert _read_args(log / "srun.args") == [
        f"--nodes={nnodes}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}", "--kill-on-bad-exit=1",
        "python3", "-m", "recipe.torchrun", f"--nnodes={nnodes}", f"--nproc_per_node={gpus}",
        "--local-ranks-filter=0",
        "--rdzv_backend=c10d", f"--rdzv_endpoint={hosts[0]}:29500", f"--rdzv_id={job_id}",
        "train.py", "--job.config_file", "configs/run.toml", *overrides,
    ]


def test_launch_knobs_from_environment(cluster):
    repo, log, env = cluster
    (repo / "configs" / "run.toml").write_text("")
    job_env = _job_env(env, repo, 2, ["gpu-101", "gpu-102"], 777, RDZV_PORT="31337", GPUS_PER_NODE="4",
                       RDZV_HOST="10.1.2.3")
    result = subprocess.run(["bash", str(repo / "slurm/train.sbatch"), "configs/run.toml"],
                            env=job_env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    args = _read_args(log / "srun.args")
    assert "--rdzv_endpoint=10.1.2.3:31337" in args and "--nproc_per_node=4" in args


@pytest.mark.parametrize("rc", [1, 3])
def test_exit_status_of_the_launch_is_the_job_status(cluster, rc):
    repo, log, env = cluster
    (repo / "configs" / "run.toml").write_text("")
    srun = Path(env["PATH"].split(":")[0]) / "srun"
    srun.write_text(FAKE_SRUN.replace('exec sleep "${FAKE_SRUN_SLEEP:-0}"', f"exit {rc}"))
    result = subprocess.run(["bash", str(repo / "slurm/train.sbatch"), "configs/run.toml"],
                            env=_job_env(env, repo, 1, ["gpu-100"], 5), capture_output=True, timeout=30)
    assert result.returncode == rc


@pytest.mark.parametrize("missing", ["config", "train.py"])
def test_bad_setup_fails_before_launch(cluster, missing):
    repo, log, env = cluster
    if missing == "config":
        config, expected = "configs/typo.toml", "config file not found: configs/typo.toml"
    else:
        (repo / "configs" / "run.toml").write_text("")
        (repo / "train.py").unlink()
        config, expected = "configs/run.toml", "train.py not found"
    result = subprocess.run(["bash", str(repo / "slurm/train.sbatch"), config],
                            env=_job_env(env, repo, 1, ["gpu-100"], 5), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and expected in result.stderr
    assert not (log / "srun.args").exists()


@pytest.mark.parametrize("variable, value, line", [
    ("GPUS_PER_NODE", "abc", "train.sbatch: GPUS_PER_NODE=abc must be a whole number"),
    ("RDZV_PORT", "29x00", "train.sbatch: RDZV_PORT=29x00 must be a whole number"),
    ("LH_MAX_REQUEUES", "5x", "train.sbatch: LH_MAX_REQUEUES=5x must be a whole number"),
    ("LH_VENV", "{tmp}/no-venv", "train.sbatch: LH_VENV={tmp}/no-venv has no bin/activate: set it to a venv"),
    ("LH_REPO_DIR", "{tmp}/no-repo", "train.sbatch: LH_REPO_DIR={tmp}/no-repo is not a folder: set it to the "
                                     "repository root"),
    ("SLURM_JOB_ID", "", "train.sbatch: not inside a SLURM job (SLURM_JOB_ID is unset): submit it with sbatch"),
], ids=["gpus-per-node", "rdzv-port", "max-requeues", "venv", "repo-dir", "outside-slurm"])
def test_a_bad_environment_knob_fails_before_launch_naming_it(cluster, tmp_path, variable, value, line):
    """The knobs the launch and the requeue read are checked at the start: LH_MAX_REQUEUES=5x used to surface only
    at the time-limit signal (the job then ended without its requeue), GPUS_PER_NODE=abc in torchrun's traceback."""
    repo, log, env = cluster
    (repo / "configs" / "run.toml").write_text("")
    job_env = _job_env(env, repo, 1, ["gpu-100"], 5, **{variable: value.format(tmp=tmp_path)})
    result = subprocess.run(["bash", str(repo / "slurm/train.sbatch"), "configs/run.toml"], cwd=repo,
                            env=job_env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.splitlines() == [line.format(tmp=tmp_path)]
    assert not (log / "srun.args").exists()


def _wait_for(path: Path, job: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert job.poll() is None, f"the job exited with {job.returncode} before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("restart,requeued", [(0, True), (19, True), (20, False)], ids=["first", "last", "past-max"])
def test_time_limit_signal_requeues_the_job(cluster, restart, requeued):
    repo, log, env = cluster
    (repo / "configs" / "run.toml").write_text("")
    job_env = _job_env(env, repo, 2, ["gpu-300", "gpu-301"], 4242, SLURM_RESTART_COUNT=str(restart),
                       FAKE_SRUN_SLEEP="60")
    job = subprocess.Popen(["bash", str(repo / "slurm/train.sbatch"), "configs/run.toml"], env=job_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(log / "srun.pid", job)
        job.send_signal(signal.SIGUSR1)  # what `--signal=B:USR1@300` sends to the batch shell
        deadline = time.monotonic() + 20
        while requeued and "requeue" not in (log / "scontrol.log").read_text():
            assert time.monotonic() < deadline, "no scontrol requeue after USR1"
            time.sleep(0.05)
        time.sleep(0.2)
        assert job.poll() is None, "the batch shell must keep waiting for the launch after the signal"
        os.kill(int((log / "srun.pid").read_text()), signal.SIGTERM)  # Slurm ends the steps on requeue
        out, err = job.communicate(timeout=20)
    finally:
        if job.poll() is None:
            job.kill()
    calls = (log / "scontrol.log").read_text().splitlines()
    assert ("requeue 4242" in calls) == requeued
    assert job.returncode == 128 + signal.SIGTERM
    if not requeued:
        assert "LH_MAX_REQUEUES=20" in err


def test_submit_chains_stages_with_afterok(cluster):
    repo, log, env = cluster
    rng = random.Random(7)
    first = rng.randrange(10**5, 10**6)
    stage1, stage2 = repo / "configs" / "a_stage1.toml", repo / "configs" / "a_stage2.toml"
    stage1.write_text("")
    stage2.write_text("")
    result = subprocess.run(
        [str(repo / "slurm/submit.sh"), "--nodes=4", "--partition", "gpu", "configs/a_stage1.toml",
         "configs/a_stage2.toml", "--", "--training.seed", "3"],
        cwd=repo, env={**env, "FAKE_FIRST_JOB": str(first)}, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{first} a_stage1 {stage1}", f"{first + 1} a_stage2 {stage2}"]
    common = ["--nodes=4", "--partition", "gpu", "slurm/train.sbatch"]
    assert _read_args(log / "sbatch.1.args") == [
        "--parsable", "--job-name=a_stage1", *common, str(stage1), "--training.seed", "3"]
    assert _read_args(log / "sbatch.2.args") == [
        "--parsable", "--job-name=a_stage2", f"--dependency=afterok:{first}", "--kill-on-invalid-dep=yes",
        *common, str(stage2), "--training.seed", "3"]
    assert (repo / "logs").is_dir()


def test_submit_rejects_a_missing_stage(cluster):
    repo, log, env = cluster
    (repo / "configs" / "a.toml").write_text("")
    result = subprocess.run([str(repo / "slurm/submit.sh"), "configs/a.toml", "configs/b.toml"], cwd=repo,
                            env={**env, "FAKE_FIRST_JOB": "1"}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "config file not found: configs/b.toml" in result.stderr
    assert not list(log.glob("sbatch.*"))


@pytest.mark.parametrize("argument, line", [
    ("--training.steps", "submit.sh: --training.steps is a train.py override, not an sbatch option: put overrides "
                         "after --"),
    ("--lighthouse.topk=64", "submit.sh: --lighthouse.topk is a train.py override, not an sbatch option: put "
                             "overrides after --"),
    ("--dependency=afterok:7", "submit.sh: --dependency=afterok:7: submit.sh sets each stage's --dependency itself "
                               "(afterok on the stage before)"),
    ("configs/a", "submit.sh: configs/a is not a config file name (configs end in .toml): did you mean "
                  "configs/a.toml?"),
    ("", "submit.sh: an empty argument: give sbatch options, then config files (.toml), then -- and overrides"),
], ids=["override-before-dashes", "override-with-value", "own-dependency", "config-without-suffix", "empty"])
def test_submit_refuses_an_argument_that_would_reach_sbatch_as_something_else(cluster, argument, line):
    """An override before `--`, a config named without .toml or an empty word would be passed to sbatch as one of
    its options (on a real cluster: a rejected or, worse, a misread submission); a --dependency would break the
    chain. Each is refused in one line before anything is submitted."""
    repo, log, env = cluster
    (repo / "configs" / "a.toml").write_text("")
    result = subprocess.run([str(repo / "slurm/submit.sh"), argument, "configs/a.toml"], cwd=repo,
                            env={**env, "FAKE_FIRST_JOB": "1"}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.splitlines() == [line]
    assert not list(log.glob("sbatch.*"))


def without_slurm(env: dict[str, str]) -> dict[str, str]:
    """`env` with the fake SLURM tools' folder taken off PATH (this machine has none of its own)."""
    return {**env, "PATH": ":".join(d for d in env["PATH"].split(":") if not (Path(d) / "sbatch").exists())}


def test_submit_dry_run_prints_the_chains_sbatch_commands_without_slurm(cluster):
    repo, log, env = cluster
    for name in ("a_stage1", "a_stage2"):
        (repo / "configs" / f"{name}.toml").write_text("")
    stages = ["--nodes=4", "configs/a_stage1.toml", "configs/a_stage2.toml", "--", "--training.seed", "3"]
    dry = subprocess.run([str(repo / "slurm/submit.sh"), "--dry-run", *stages], cwd=repo, env=without_slurm(env),
                         capture_output=True, text=True, timeout=30)
    assert dry.returncode == 0, dry.stderr
    assert not (repo / "logs").exists() and not list(log.glob("sbatch.*"))
    submitted = subprocess.run([str(repo / "slurm/submit.sh"), *stages], cwd=repo,
                               env={**env, "FAKE_FIRST_JOB": "41"}, capture_output=True, text=True, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    printed = [shlex.split(line.replace("afterok:JOB1", "afterok:41")) for line in dry.stdout.splitlines()]
    assert printed == [["sbatch", *_read_args(log / f"sbatch.{n}.args")] for n in (1, 2)]


def test_submit_without_sbatch_ends_in_one_line(cluster):
    repo, _, env = cluster
    (repo / "configs" / "a.toml").write_text("")
    result = subprocess.run([str(repo / "slurm/submit.sh"), "configs/a.toml"], cwd=repo, env=without_slurm(env),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "submit.sh: sbatch not found: this machine has no SLURM (--dry-run prints the chain's sbatch commands)"]


REAL_SRUN = """#!/usr/bin/env bash
# One node: drop srun's own options and run the step here.
while [[ $1 == --* ]]; do shift; done
exec "$@"
"""


@pytest.mark.skipif(not (REPO / "train.py").exists() or not (REPO / "configs/debug.toml").exists(),
                    reason="needs the recipe's train.py and configs/debug.toml")
@pytest.mark.slow
def test_the_launch_line_trains_with_real_torchrun(cluster, tmp_path):
    """The built command line is valid for torchrun: c10d rendezvous on the head host, then train.py runs."""
    _, log, env = cluster
    _write_executable(Path(env["PATH"].split(":")[0]) / "srun", REAL_SRUN)
    port = free_port()
    dump = tmp_path / "run"
    job_env = _job_env(env, REPO, 1, ["localhost"], 31, GPUS_PER_NODE="1", RDZV_PORT=str(port), SLURM_CPUS_PER_TASK="2")
    result = subprocess.run(
        ["bash", str(REPO / "slurm/train.sbatch"), "configs/debug.toml", "--training.steps", "2",
         "--job.dump_folder", str(dump)],
        env=job_env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"--rdzv_endpoint=localhost:{port}" in result.stdout
    assert "Training completed" in result.stdout + result.stderr
