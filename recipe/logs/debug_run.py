"""The short CPU run of the debug config that the golden loss file records and the crash-resume test kills.

8 steps of 256 tokens (one LR schedule, warmup 2), every step logged, a full checkpoint every 2 steps and at
the last, as one CPU process with one intra-op thread (fastest for this tiny model; more give the same losses).
"""
from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import IO, Any, Sequence

from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.logs.run_logs import LOSS_TAG
from recipe.logs.run_record import REPO

STEPS, INTERVAL = 8, 2
ARGS = ["--job.config_file", "configs/debug.toml", "--training.steps", str(STEPS), "--training.seq_len", "256",
        "--metrics.log_freq", "1", "--checkpoint.enable", "--checkpoint.interval", str(INTERVAL)]


def debug_run_command(dump_folder: Path, program: Sequence[str] = ("train.py",)) -> tuple[list[str], dict[str, str]]:
    """The command and environment of `python train.py` (or `python <program>` that runs it) with ARGS writing to
    dump_folder."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a one-process job of its own, also when started from inside another job
    return [sys.executable, *program, *ARGS, "--job.dump_folder", str(dump_folder)], env


def start_debug_run(dump_folder: Path, log: IO[str]) -> subprocess.Popen:
    """`python train.py` with ARGS writing to dump_folder, its output to log."""
    command, env = debug_run_command(dump_folder)
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


def final_losses(dump_folder: Path) -> dict[int, float]:
    """Loss of every logged step, from its last record (a resumed run appends the steps it repeats)."""
    return {r["step"]: r[LOSS_TAG] for r in read_metrics(str(dump_folder / METRICS_FILE))}


def golden_record(dump_folder: Path) -> dict[str, Any]:
    """Run the debug config to its end in dump_folder; the losses of steps 1..STEPS and what produced them."""
    log = dump_folder.parent / f"{dump_folder.name}.log"
    with open(log, "w") as out:
        code = start_debug_run(dump_folder, out).wait()
    if code != 0:
        raise RuntimeError(f"train.py exited with {code}:\n{log.read_text()[-4000:]}")
    losses = final_losses(dump_folder)
    return {"args": ARGS, "torch": version("torch"), "torchtitan": version("torchtitan"),
            "losses": [losses[step] for step in range(1, STEPS + 1)]}
