"""The short CPU debug run of scripts/golden_losses.py (`recipe.logs.debug_run`): SIGKILLed at random steps and in the
middle of a checkpoint save, then restarted, it ends with the losses of an uninterrupted run, bit for bit, and resumes
only from complete checkpoints; the uninterrupted losses are the golden file's."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from importlib.metadata import version
from pathlib import Path
from typing import Callable, Iterator

import pytest

from recipe.logs.debug_run import ARGS, INTERVAL, STEPS, debug_run_command, final_losses
from recipe.logs.layout import METRICS_FILE
from recipe.resilience.checkpoint_manifest import MANIFEST

from .warm_python import warm_job

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "debug_losses.json"
# Across CPU instruction sets (AVX-512, AVX2, none) and thread counts the losses differ by at most 2.2e-7
# relative; a 0.1% change of the learning rate moves them by up to 4e-4.
GOLDEN_REL = 1e-4
SAVE_STEPS = [s for s in range(1, STEPS + 1) if s % INTERVAL == 0 or s == STEPS]
TIMEOUT_S = 300
# python -c: train.py, except that saving `folder` stops for good once its data files are written, just
# before DCP writes `.metadata` (its last file), after creating the file `signal`.
STALLED_SAVE = """\
import pathlib, runpy, threading
from torch.distributed.checkpoint.filesystem import FileSystemWriter
finish = FileSystemWriter.finish
def stalled_finish(self, *args, **kwargs):
    if pathlib.Path(self.path) == pathlib.Path({folder!r}):
        pathlib.Path({signal!r}).touch()
        threading.Event().wait()
    finish(self, *args, **kwargs)
FileSystemWriter.finish = stalled_finish
runpy.run_path("train.py", run_name="__main__")
"""


class Run:
    """One train.py process of the debug run in `folder`, its output in `log`: forked from the warm interpreter,
    unless the test signals its start-up (`cold`)."""

    def __init__(self, folder: Path, log: Path, program: tuple[str, ...] = ("train.py",), cold: bool = False) -> None:
        self.folder, self.log = folder, log
        metrics = folder / METRICS_FILE
        self.offset = metrics.stat().st_size if metrics.exists() else 0  # restarts append to the file
        command, env = debug_run_command(folder, program)
        if not cold:
            command, env = warm_job(command[1:], env)
        with open(log, "w") as out:
            self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)

    def logged_steps(self) -> list[int]:
        """Steps this process has logged so far (complete lines of metrics.jsonl)."""
        path = self.folder / METRICS_FILE
        if not path.exists():
            return []
        with open(path, "rb") as f:
            f.seek(self.offset)
            lines = f.read().decode().splitlines(keepends=True)
        return [json.loads(line)["step"] for line in lines if line.endswith("\n")]

    def wait_until(self, condition: Callable[[], bool]) -> None:
        """Poll `condition` every 10 ms while the process runs, for at most TIMEOUT_S."""
        deadline = time.monotonic() + TIMEOUT_S
        while not condition():
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"timed out:\n{self.tail()}"
            time.sleep(0.01)

    def sigkill_when(self, condition: Callable[[], bool]) -> None:
        """SIGKILL the process as soon as `condition` holds (polled every 10 ms); it must still be running."""
        try:
            self.wait_until(condition)
        finally:
            self.proc.send_signal(signal.SIGKILL)  # a no-op once it has exited
        assert self.proc.wait() == -signal.SIGKILL, f"ended before the kill:\n{self.tail()}"

    def signal_when(self, condition: Callable[[], bool], signum: int, times: int = 1) -> tuple[int, str]:
        """Send `signum` `times` times, 0.1 s apart, as soon as `condition` holds; the exit code and the last
        line of the output."""
        try:
            self.wait_until(condition)
            for _ in range(times):
                self.proc.send_signal(signum)
                time.sleep(0.1)
            code = self.proc.wait(timeout=TIMEOUT_S)
        finally:
            self.proc.kill()  # a no-op once it has exited
        assert "Traceback" not in self.log.read_text(), self.tail()
        return code, self.log.read_text().splitlines()[-1]

    def finish(self) -> None:
        """Wait for the process to end by itself, successfully (kill it after TIMEOUT_S)."""
        try:
            assert self.proc.wait(timeout=TIMEOUT_S) == 0, self.tail()
        finally:
            self.proc.kill()  # a no-op once it has exited

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Iterator[Run]:
    """The debug run without interruption, started at once so that it trains beside the crash test's runs."""
    root = tmp_path_factory.mktemp("uninterrupted")
    run = Run(root / "run", root / "run.log")
    yield run
    run.proc.kill()  # a no-op once it has exited
    run.proc.wait()


def complete_steps(checkpoints: Path) -> list[int]:
    """Steps whose checkpoint folder holds `.metadata`, the file DCP writes last, and the manifest written after it
    (a kill between the two leaves a step a resume passes over)."""
    return sorted(int(p.name.removeprefix("step-")) for p in checkpoints.glob("step-*")
                  if (p / ".metadata").exists() and (p / MANIFEST).exists())


def release(torch_version: str) -> str:
    """The major.minor release of a torch version: '2.13' of '2.13.0+cpu'."""
    return ".".join(torch_version.split(".")[:2])


@pytest.mark.slow
def test_sigkill_at_random_steps_and_mid_save_then_restart_ends_with_the_uninterrupted_losses(
    uninterrupted, tmp_path
):
    rng = random.Random(0)
    after = rng.randint(1, STEPS - 3)  # the first process is killed once it has logged this step,
    saving = rng.choice([s for s in SAVE_STEPS if s > after])  # the second while it saves this one,
    after_restart = rng.randint(saving - INTERVAL + 1, STEPS - 1)  # the third once it has logged this step
    folder, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoint"
    starts = []  # (log of a process, the step after the latest complete checkpoint when it started)

    def start(name: str, program: tuple[str, ...] = ("train.py",)) -> Run:
        starts.append((tmp_path / name, max(complete_steps(checkpoints), default=0) + 1))
        return Run(folder, tmp_path / name, program)

    first = start("after-a-step.log")
    first.sigkill_when(lambda: after in first.logged_steps())

    stalled, signal_file = checkpoints / f"step-{saving}", tmp_path / "stalled"
    second = start("while-saving.log", ("-c", STALLED_SAVE.format(folder=str(stalled), signal=str(signal_file))))
    second.sigkill_when(signal_file.exists)
    # Half-written: every data file, no .metadata. The next process resumes from the save before it.
    assert list(stalled.glob("*.distcp")) and not (stalled / ".metadata").exists()
    assert max(complete_steps(checkpoints), default=0) == saving - INTERVAL

    third = start("after-a-restart.log")
    third.sigkill_when(lambda: after_restart in third.logged_steps())
    start("last.log").finish()

    for log, step in starts:
        assert f"Training starts at step {step}\n" in log.read_text(), log
    assert complete_steps(checkpoints) == SAVE_STEPS  # the half-written folder was saved again, completely
    uninterrupted.finish()
    assert final_losses(folder) == final_losses(uninterrupted.folder)
    assert sorted(final_losses(folder)) == list(range(1, STEPS + 1))


def unreadable_manifest(path: Path) -> None:
    """One of the ways a manifest.json stops vouching for its step: random bytes, empty, `{}`."""
    random.choice([lambda: path.write_bytes(os.urandom(64) + b"\xff"), lambda: path.write_text(""),
                   lambda: path.write_text("{}")])()


@pytest.mark.slow
def test_signals_at_start_up_mid_step_and_in_bursts_and_a_manifest_that_cannot_vouch_end_with_the_uninterrupted_losses(
    uninterrupted, tmp_path
):
    """SIGTERM during start-up, three Ctrl-C at once mid-step and again during start-up, and a flipped byte in the
    newest checkpoint under a manifest that cannot be read: each ends in one line naming where a restart resumes,
    the restart passes over the damaged step, and the run ends with the uninterrupted losses, bit for bit."""
    folder, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoint"
    def a_second_in() -> Callable[[], bool]:  # train.py is importing torch then, well after its first line
        began = time.monotonic()
        return lambda: time.monotonic() > began + 1

    starting = Run(folder, tmp_path / "sigterm-at-start-up.log", cold=True)
    assert starting.signal_when(a_second_in(), signal.SIGTERM) == (
        143, "stopped: terminated (SIGTERM) at step 0; nothing was trained yet; a restart resumes from the start (no "
             "checkpoint yet)")
    mid_step = Run(folder, tmp_path / "ctrl-c-burst.log")
    code, line = mid_step.signal_when(lambda: 5 in mid_step.logged_steps(), signal.SIGINT, times=3)
    newest = max(complete_steps(checkpoints))
    assert code == 130 and re.fullmatch(rf"stopped: interrupted \(Ctrl-C\) at step \d+( \(during the save of step \d+, "
                                        rf"which finished first\))?; a restart resumes from step-{newest}", line), \
        mid_step.tail()
    shard = checkpoints / f"step-{newest}" / "__0_0.distcp"
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))
    unreadable_manifest(checkpoints / f"step-{newest}" / MANIFEST)
    older = f"step-{newest - INTERVAL}"
    burst = Run(folder, tmp_path / "ctrl-c-burst-at-start-up.log", cold=True)
    assert burst.signal_when(a_second_in(), signal.SIGINT, times=3) == (
        130, f"stopped: interrupted (Ctrl-C) at step 0 (during start-up); a restart resumes from {older}")
    last = Run(folder, tmp_path / "last.log")
    last.finish()
    assert f"{checkpoints}/step-{newest} is damaged: {MANIFEST} " in last.log.read_text()
    assert f"Training starts at step {newest - INTERVAL + 1}\n" in last.log.read_text()
    uninterrupted.finish()
    assert final_losses(folder) == final_losses(uninterrupted.folder)


def test_the_debug_run_losses_match_the_golden_file(uninterrupted):
    golden = json.loads(GOLDEN.read_text())
    regenerate = f"regenerate with: python scripts/golden_losses.py --write {GOLDEN.relative_to(REPO)}"
    assert golden["args"] == ARGS, f"scripts/golden_losses.py runs other arguments than the golden file's; {regenerate}"
    installed = version("torch")
    if release(installed) != release(golden["torch"]):
        pytest.skip(f"the golden losses are torch {golden['torch']}'s; torch {installed} may initialize the model "
                    "differently (2.11 and 2.13 draw different trunc_normal_ weights from the same seed)")
    uninterrupted.finish()
    losses = final_losses(uninterrupted.folder)
    assert [losses[s] for s in range(1, STEPS + 1)] == pytest.approx(golden["losses"], rel=GOLDEN_REL, abs=0), (
        f"if the change is meant to move the losses, {regenerate}")
