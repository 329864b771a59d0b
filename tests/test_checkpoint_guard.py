"""A resume checks each checkpoint against its manifest and skips a newest one that is damaged or cannot be
loaded for the newest older one that can, naming what failed; a checkpoint of another data-parallel degree is
named and never skipped; a save on a full disk says so; Ctrl-C ends a job with one line."""
import errno
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import time
import warnings
from collections import namedtuple
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import models  # noqa: F401  (before torchtitan)
from torch.distributed.checkpoint.api import CheckpointException
from recipe.resilience import checkpoint_guard, held_signals
from recipe.train import trainer
from recipe.resilience.checkpoint_guard import (CheckpointError, DataParallelMismatch, complete_steps,
                                     load_newest_intact, resume_step, save_or_stop, unfinished_steps)
from recipe.resilience.checkpoint_manifest import (MANIFEST, UnreadableManifest, crc32, manifest_faults, read_manifest,
                                        write_manifest)
from recipe.launch import free_port, single_process_env

from .helpers import signal_when, train_in_one_process
from .warm_python import warm_job

REPO = Path(__file__).resolve().parent.parent


def checkpoints(tmp_path, steps, half_written=()):
    """Checkpoints of random bytes at `steps`, each with its manifest, and folders without `.metadata` (saves that
    never finished) at `half_written`."""
    folder = tmp_path / "checkpoint"
    for step in [*steps, *half_written]:
        (folder / f"step-{step}").mkdir(parents=True)
        (folder / f"step-{step}" / "__0_0.distcp").write_bytes(os.urandom(32))
    for step in steps:
        (folder / f"step-{step}" / ".metadata").write_bytes(os.urandom(32))
        write_manifest(str(folder / f"step-{step}"), data_parallel_degree=1)
    return str(folder)


class FakeLoad:
    """Records the steps asked for; the steps in `damaged` raise as DCP does for a damaged file."""

    def __init__(self, damaged):
        self.damaged, self.asked = set(damaged), []

    def __call__(self, step):
        self.asked.append(step)
        if step in self.damaged:
            raise RuntimeError("Traceback (most recent call last): (RANK 0)\n  ...\n"
                               f"unexpected EOF while reading step {step}\n")
        return True


def test_complete_steps_are_the_folders_with_metadata_newest_first(tmp_path):
    folder = checkpoints(tmp_path, [2, 10, 4], half_written=[12])
    assert complete_steps(folder) == [10, 4, 2]
    assert complete_steps(str(tmp_path / "none")) == []


def test_a_damaged_newest_checkpoint_gives_way_to_the_newest_older_one_with_a_warning(tmp_path, caplog):
    folder = checkpoints(tmp_path, [2, 4, 6])
    load = FakeLoad(damaged=[6, 4])
    with caplog.at_level(logging.WARNING):
        assert load_newest_intact(load, folder) is True
    assert load.asked == [6, 4, 2]
    warnings = [r.getMessage() for r in caplog.records if "cannot be loaded" in r.getMessage()]
    assert warnings == [f"{folder}/step-6 cannot be loaded (RuntimeError: unexpected EOF while reading step 6); "
                        "trying step-4",
                        f"{folder}/step-4 cannot be loaded (RuntimeError: unexpected EOF while reading step 4); "
                        "trying step-2"]


def test_no_loadable_checkpoint_or_an_explicit_step_ends_in_one_line(tmp_path):
    folder = checkpoints(tmp_path, [2, 4])
    with pytest.raises(CheckpointError, match=rf"^{folder}/step-2 cannot be loaded \(RuntimeError: unexpected EOF "
                                              r"while reading step 2\) and no older complete checkpoint is left"):
        load_newest_intact(FakeLoad(damaged=[2, 4]), folder)
    explicit = FakeLoad(damaged=[4])
    with pytest.raises(RuntimeError, match="step 4"):  # a step asked for by number is that step or nothing
        load_newest_intact(explicit, folder, step=4)
    assert explicit.asked == [4]
    fresh = FakeLoad(damaged=[])
    assert load_newest_intact(fresh, str(tmp_path / "none")) is True and fresh.asked == [-1]


def manifested(tmp_path, steps):
    """Checkpoints at `steps` of random bytes, each with its manifest (as a save of 2 data-parallel ranks)."""
    folder = checkpoints(tmp_path, steps)
    for step in steps:
        (Path(folder) / f"step-{step}" / "__1_0.distcp").write_bytes(os.urandom(random.randint(1000, 5000)))
        write_manifest(f"{folder}/step-{step}", data_parallel_degree=2)
    return folder


def test_the_manifest_records_sizes_checksums_and_the_data_parallel_degree_and_finds_any_change(tmp_path):
    folder = manifested(tmp_path, [4])
    step = Path(folder) / "step-4"
    manifest = read_manifest(str(step))
    assert manifest["data_parallel_degree"] == 2 and sorted(manifest["files"]) == [".metadata", "__0_0.distcp",
                                                                                   "__1_0.distcp"]
    data = step / "__1_0.distcp"
    assert manifest["files"]["__1_0.distcp"] == {"bytes": data.stat().st_size, "crc32": crc32(str(data))}
    assert manifest_faults(str(step), manifest) == []
    offset = random.randrange(data.stat().st_size - 64)
    with open(data, "r+b") as f:  # zeroed bytes inside: same size, another checksum
        f.seek(offset)
        f.write(bytes(64))
    assert manifest_faults(str(step), manifest) == ["__1_0.distcp fails its checksum"]
    assert manifest_faults(str(step), manifest, checksums=False) == []  # the switch: sizes only
    with open(step / "__0_0.distcp", "ab") as f:
        f.write(b"x")
    (step / ".metadata").unlink()
    assert manifest_faults(str(step), manifest) == [".metadata is missing", "__0_0.distcp holds 33 bytes, the save "
                                                    "wrote 32", "__1_0.distcp fails its checksum"]
    (step / MANIFEST).write_text("{not json")
    with pytest.raises(UnreadableManifest, match=r"^manifest.json is not JSON \(JSONDecodeError\)$"):
        read_manifest(str(step))
    (step / MANIFEST).unlink()
    assert read_manifest(str(step)) is None


def test_a_damaged_checkpoint_is_skipped_before_loading_naming_the_file_and_unfinished_saves_are_named(tmp_path,
                                                                                                        caplog):
    folder = manifested(tmp_path, [2, 4, 6])
    (Path(folder) / "step-8").mkdir()  # a save that never finished
    with open(Path(folder) / "step-6" / "__1_0.distcp", "r+b") as f:
        f.write(bytes(16))
    load = FakeLoad(damaged=[])
    with caplog.at_level(logging.WARNING):
        assert load_newest_intact(load, folder) is True
    assert load.asked == [4]  # step-6 never reached DCP
    assert unfinished_steps(folder) == [8]
    assert [r.getMessage() for r in caplog.records] == [
        f"{folder}: step-8 has no .metadata (a save that did not finish): not a checkpoint to resume from",
        f"{folder}/step-6 is damaged: __1_0.distcp fails its checksum; trying step-4"]
    with pytest.raises(CheckpointError, match=rf"^{folder}/step-6 is damaged: __1_0.distcp fails its checksum$"):
        load_newest_intact(FakeLoad(damaged=[]), folder, step=6)  # a step asked for by number: no fallback
    with pytest.raises(CheckpointError, match=r"^checkpoint.initial_load_path: .*/step-6 is damaged"):
        load_newest_intact(FakeLoad(damaged=[]), str(tmp_path / "fresh"), initial_load_path=f"{folder}/step-6")


def flip_a_byte(path: Path) -> None:
    """One byte inside `path` inverted: same size, another checksum."""
    offset = random.randrange(path.stat().st_size)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


def edit_manifest(change):
    """A tampering: `change(record)` of the parsed manifest.json, written back as JSON."""
    def tamper(path: Path) -> None:
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))
    return tamper


# (id, what is done to step-6's manifest.json, the warning's reason)
TAMPERED = [
    ("random-bytes", lambda path: path.write_bytes(os.urandom(random.randint(1, 200)) + b"\xff"),
     r"manifest.json is not JSON \((UnicodeDecodeError|JSONDecodeError)\)"),
    ("empty", lambda path: path.write_text(""), r"manifest.json is not JSON \(JSONDecodeError\)"),
    ("empty-object", lambda path: path.write_text("{}"), "manifest.json has no record of the step's files"),
    ("no-files-listed", edit_manifest(lambda record: record.update(files={})),
     r"\.metadata is not in manifest.json and 2 more"),
    ("shard-entry-deleted", edit_manifest(lambda record: record["files"].pop("__1_0.distcp")),
     "__1_0.distcp is not in manifest.json"),
    ("size-deleted", edit_manifest(lambda record: record["files"]["__1_0.distcp"].pop("bytes")),
     "manifest.json records no size for __1_0.distcp"),
    ("checksum-deleted", edit_manifest(lambda record: record["files"]["__1_0.distcp"].pop("crc32")),
     "manifest.json records checksums for some files only"),
    ("checksums-not-recorded", edit_manifest(lambda record: [entry.pop("crc32") for entry in record["files"].values()]),
     r"its manifest.json records no checksums \(saved with \[resilience\] checksums = false\); \[checkpoint\] "
     "load_unverified = true loads such a step"),
    ("degree-not-a-number", edit_manifest(lambda record: record.update(data_parallel_degree="one")),
     'manifest.json records data_parallel_degree="one", not a number of ranks'),
    ("manifest-deleted", lambda path: path.unlink(),
     r"it has no manifest.json \(a save cut before its end, or written by another program\); \[checkpoint\] "
     "load_unverified = true loads such a step"),
]


@pytest.mark.parametrize("tamper, reason", [row[1:] for row in TAMPERED], ids=[row[0] for row in TAMPERED])
def test_a_manifest_that_cannot_vouch_for_every_file_makes_the_step_damaged(tmp_path, caplog, tamper, reason):
    """A flipped byte in a shard hides behind none of these: the step falls back, with one warning naming why."""
    folder = manifested(tmp_path, [4, 6])
    flip_a_byte(Path(folder) / "step-6" / "__1_0.distcp")
    tamper(Path(folder) / "step-6" / MANIFEST)
    load = FakeLoad(damaged=[])
    with caplog.at_level(logging.WARNING):
        assert load_newest_intact(load, folder) is True
    assert load.asked == [4]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(rf"{folder}/step-6 is damaged: {reason}; trying step-4", warning), warning
    assert resume_step(folder) == 4
    with pytest.raises(CheckpointError, match=rf"^{folder}/step-6 is damaged: {reason}$"):
        load_newest_intact(FakeLoad(damaged=[]), folder, step=6)  # asked for by number: no fallback


def test_a_step_without_a_manifest_loads_unverified_only_when_asked_and_an_initial_load_path_with_a_warning(
        tmp_path, caplog):
    folder = checkpoints(tmp_path, [2])
    (Path(folder) / "step-2" / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=rf"^{folder}/step-2 is damaged: it has no {MANIFEST} .* and no older "
                                              "complete checkpoint is left to resume from$"):
        load_newest_intact(FakeLoad(damaged=[]), folder)
    assert resume_step(folder) is None and resume_step(folder, unverified=True) == 2
    with caplog.at_level(logging.WARNING):
        assert load_newest_intact(FakeLoad(damaged=[]), folder, unverified=True) is True
        assert load_newest_intact(FakeLoad(damaged=[]), str(tmp_path / "fresh"),
                                  initial_load_path=f"{folder}/step-2") is True
    assert [r.getMessage() for r in caplog.records] == [
        f"{folder}/step-2: it has no {MANIFEST} (a save cut before its end, or written by another program); loading "
        "it unverified"] * 2


def test_a_step_saved_without_checksums_loads_only_unverified_and_says_so_once(tmp_path, caplog):
    """Sizes alone pass a flipped byte: such a step never passes as verified."""
    folder = checkpoints(tmp_path, [2])
    write_manifest(f"{folder}/step-2", data_parallel_degree=1, checksums=False)
    flip_a_byte(Path(folder) / "step-2" / "__0_0.distcp")
    with pytest.raises(CheckpointError, match="records no checksums"):
        load_newest_intact(FakeLoad(damaged=[]), folder)
    assert resume_step(folder) is None and resume_step(folder, unverified=True) == 2
    with caplog.at_level(logging.WARNING):
        assert load_newest_intact(FakeLoad(damaged=[]), folder, unverified=True) is True
    assert [r.getMessage() for r in caplog.records] == [
        f"{folder}/step-2: its {MANIFEST} records no checksums (saved with [resilience] checksums = false); loading it "
        "unverified"]


def test_a_save_that_overwrites_a_step_folder_raises_no_dcp_warning(tmp_path):
    """A resume that passed over a damaged step saves that step again; DCP's two-line warning about it is noise."""
    state = {"w": torch.zeros(2)}

    def save(step, last_step=False):
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / f"step-{step}")))

    save(1)
    with warnings.catch_warnings(record=True) as plain:
        warnings.simplefilter("always")
        save(1)
    assert [w for w in plain if "Detected an existing checkpoint" in str(w.message)]  # what DCP says by itself
    with warnings.catch_warnings(record=True) as guarded:
        warnings.simplefilter("always")
        save_or_stop(save, str(tmp_path), 1)
    assert not [w for w in guarded if "Detected an existing checkpoint" in str(w.message)]


def test_another_data_parallel_degree_is_named_and_never_falls_back_to_an_older_step(tmp_path):
    folder = manifested(tmp_path, [2, 4])

    def load(step):
        load.asked.append(step)
        raise RuntimeError("Missing key in checkpoint state_dict: dataloader.dp_rank_1.")

    load.asked = []
    with pytest.raises(DataParallelMismatch, match=rf"^{folder}/step-4 was written by a run with another number of "
                                                   r"data-parallel ranks \(RuntimeError: Missing key"):
        load_newest_intact(load, folder)
    assert load.asked == [4]


def test_a_save_on_a_full_disk_says_so_and_other_failures_pass_through(tmp_path, monkeypatch):
    step = random.randint(1, 1000)

    def full(curr_step, last_step):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as err:
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598") from err

    with pytest.raises(CheckpointError, match=rf"^saving step {step} into {tmp_path} failed: the disk is full"):
        save_or_stop(full, str(tmp_path), step)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 10**5, 10**5))
    def dcp_fails(curr_step, last_step):  # as DCP reports torch.save's failure on a full disk
        raise CheckpointException("CheckpointException ranks:dict_keys([0])",
                                  {0: RuntimeError("unexpected pos 704 vs 598")})

    with pytest.raises(CheckpointError, match="the disk is full"):  # torch's message alone, on an all but full disk
        save_or_stop(dcp_fails, str(tmp_path / "checkpoint"), step)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**9, 10**12 - 10**9))
    with pytest.raises(KeyError):
        save_or_stop(lambda s, last: {}["missing"], str(tmp_path), step)
    saved = []
    save_or_stop(lambda s, last: saved.append((s, last)), str(tmp_path), step, True)
    assert saved == [(step, True)]
    assert checkpoint_guard.FULL_DISK_FREE_BYTES > 10**5


@pytest.fixture
def signal_handlers(monkeypatch):
    """The process's SIGINT and SIGTERM handlers and the held-signal state, given back after the test."""
    monkeypatch.setattr(held_signals, "_noted", {})
    monkeypatch.setattr(held_signals, "_interrupted", False)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def press(signum=signal.SIGINT, times=1):
    """What a terminal or SLURM does: `signum` to this process, `times` times."""
    for _ in range(times):
        os.kill(os.getpid(), signum)


# (id, signals held from the start as train.py holds them, a signal sent before main, during training, while
#  closing; the exit code; the line up to where a restart resumes)
SIGNALS = [
    ("ctrl-c-mid-step", False, None, lambda: press(), None, 130, "interrupted (Ctrl-C) at step {step}"),
    ("ctrl-c-burst", False, None, lambda: press(), lambda: press(times=2), 130, "interrupted (Ctrl-C) at step {step}"),
    ("ctrl-c-at-start-up", True, lambda: press(times=3), None, None, 130,
     "interrupted (Ctrl-C) at step 0 (during start-up)"),
    ("ctrl-c-while-closing", True, None, None, lambda: press(), 130,
     "interrupted (Ctrl-C) at step {step} (while the job was closing)"),
    ("sigterm-while-closing", True, None, None, lambda: press(signal.SIGTERM), 143,
     "terminated (SIGTERM) while the job was closing after step {step}"),
]


@pytest.mark.parametrize("hold, before, training, closing, code, line", [row[1:] for row in SIGNALS],
                         ids=[row[0] for row in SIGNALS])
@pytest.mark.parametrize("saved", ["intact", "none", "damaged"], ids=["a-checkpoint", "none-yet", "none-intact"])
def test_a_signal_at_any_moment_ends_the_job_in_one_line_naming_where_a_restart_resumes(
        tmp_path, monkeypatch, capsys, signal_handlers, hold, before, training, closing, code, line, saved):
    step, latest = random.randint(3, 100), random.randint(1, 2)
    if saved != "none":  # a checkpoint with its manifest (or without), and a newer one whose save was cut before it
        folder = checkpoints(tmp_path / "run", [latest, latest + 1])
        for cut in [latest + 1] + ([latest] if saved == "damaged" else []):
            (Path(folder) / f"step-{cut}" / MANIFEST).unlink()

    class Job:
        closed = False

        def __init__(self, config, args):
            self.step = 0

        def train(self):
            self.step = step
            if training:
                training()

        def close(self):
            Job.closed = True
            if closing:
                closing()

    monkeypatch.setattr(trainer, "LighthouseTrainer", Job)
    monkeypatch.delenv("LIGHTHOUSE_DEBUG", raising=False)
    if hold:
        held_signals.hold_signals()
    if before:
        before()
    with pytest.raises(SystemExit) as exit_info:
        trainer.main(["--job.config_file", "configs/debug.toml", "--job.dump_folder", str(tmp_path / "run")])
    resumes = {"intact": f"step-{latest}", "none": "the start (no checkpoint yet)",
               "damaged": f"none of the checkpoints in {tmp_path}/run/checkpoint (each is damaged)"}[saved]
    assert exit_info.value.code == code and Job.closed == (before is None)  # a trainer built is closed
    assert capsys.readouterr().err == f"stopped: {line.format(step=step)}; a restart resumes from {resumes}\n"


@pytest.mark.slow
def test_ctrl_c_during_training_ends_train_py_in_one_line(tmp_path):
    env = {**os.environ, **single_process_env(), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("LIGHTHOUSE_DEBUG", None)
    metrics = tmp_path / "run" / "metrics.jsonl"
    command, env = warm_job(["train.py", "--job.config_file", "configs/debug.toml", "--job.dump_folder",
                             str(tmp_path / "run"), "--training.steps", "1000", "--training.seq_len", "128"], env)
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal gives it
    _, err = signal_when(job, lambda: metrics.exists() and metrics.read_text().count("\n") > 3, signal.SIGINT)
    assert job.returncode == 130, err[-3000:]
    assert re.fullmatch(r"stopped: interrupted \(Ctrl-C\) at step \d+; a restart resumes from the start \(no "
                        r"checkpoint yet\)", err.splitlines()[-1]), err[-3000:]
    assert "Traceback" not in err


SIGTERM_TO_END_S = 15  # a save of the debug model, closing, and a rank's wait for rank 0 (OTHER_RANKS_WAIT_S)


@pytest.mark.slow
def test_sigterm_to_the_launcher_saves_the_step_on_every_rank_ends_in_seconds_without_a_traceback_and_resumes(
        tmp_path):
    """Slurm signals the launcher (`python -m recipe.torchrun`, as slurm/train.sbatch starts torchrun): torchrun
    passes SIGTERM to both ranks, which agree on the step, save it whole (with its manifest) and end within
    seconds, no rank left for torchrun to kill; the job ends with the recipe's line and the launcher's, exit code
    143, no traceback. A restart with the same command resumes from that step."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "SLURM_JOB_ID": "4242"}
    env.pop("LIGHTHOUSE_DEBUG", None)
    run, metrics = tmp_path / "run", tmp_path / "run" / "metrics.jsonl"

    def launcher(steps: int) -> tuple[list[str], dict[str, str]]:
        return warm_job(["-m", "recipe.torchrun", "--nproc_per_node=2", "--master_port", str(free_port()),
                         "train.py", "--job.config_file", "configs/debug.toml", "--job.dump_folder", str(run),
                         "--training.steps", str(steps), "--training.seq_len", "128", "--checkpoint.enable",
                         "--checkpoint.interval", "1000", "--parallelism.data_parallel_shard_degree", "2",
                         "--training.local_batch_size", "1"], env)

    command, job_env = launcher(1000)
    job = subprocess.Popen(command, cwd=REPO, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signalled_at = []

    def trained_two_steps() -> bool:
        if metrics.exists() and metrics.read_text().count("\n") > 2:
            signalled_at.append(time.monotonic())
        return bool(signalled_at)

    _, err = signal_when(job, trained_two_steps, signal.SIGTERM)
    assert time.monotonic() - signalled_at[0] < SIGTERM_TO_END_S, err[-3000:]  # torchrun's SIGKILL comes at 30 s
    stopped = re.compile(r"stopped: terminated \(SIGTERM\) at step (\d+); saved step-\1 in [0-9.]+ s; a restart "
                         r"resumes from step-\1")
    lines = [line for line in err.splitlines() if stopped.fullmatch(line)]
    assert len(lines) == 1 and job.returncode == 143, err[-3000:]
    assert err.splitlines()[-1] == "torchrun: stopped by SIGTERM, which every rank was passed; they have ended"
    assert "Traceback" not in err and "forcefully exiting via" not in err, err[-3000:]
    saved = int(stopped.fullmatch(lines[0]).group(1))
    assert complete_steps(str(run / "checkpoint")) == [saved]
    folder = str(run / "checkpoint" / f"step-{saved}")
    assert manifest_faults(folder, read_manifest(folder)) == [] and read_manifest(folder)["data_parallel_degree"] == 2
    command, job_env = launcher(saved + 1)
    again = subprocess.run(command, cwd=REPO, env=job_env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"Training starts at step {saved + 1}" in again.stdout + again.stderr


# python -c: train.py, except that each checkpoint save takes 3 s more once its data files are written (before
# DCP writes `.metadata`), after creating the file `signal`.
SLOW_SAVE = """\
import pathlib, runpy, time
from torch.distributed.checkpoint.filesystem import FileSystemWriter
finish = FileSystemWriter.finish
def slow_finish(self, *args, **kwargs):
    pathlib.Path({signal!r}).touch()
    time.sleep(3)
    finish(self, *args, **kwargs)
FileSystemWriter.finish = slow_finish
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_sigterm_saves_the_step_and_exits_143_and_ctrl_c_during_a_save_lets_it_finish(tmp_path):
    env = {**os.environ, **single_process_env(), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "SLURM_JOB_ID": "4242"}  # under SLURM, [resilience] save_on_sigterm = "auto" saves
    env.pop("LIGHTHOUSE_DEBUG", None)
    run, metrics = tmp_path / "run", tmp_path / "run" / "metrics.jsonl"
    args = ["--job.config_file", "configs/debug.toml", "--job.dump_folder", str(run), "--training.steps", "1000",
            "--training.seq_len", "128", "--checkpoint.enable"]

    def start(program, *extra):
        command, job_env = warm_job([*program, *args, *extra], env)
        return subprocess.Popen(command, cwd=REPO, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    job = start(["train.py"], "--checkpoint.interval", "1000")  # no save of its own before the signal
    _, err = signal_when(job, lambda: metrics.exists() and metrics.read_text().count("\n") > 2, signal.SIGTERM)
    assert job.returncode == 143, err[-3000:]
    line = err.splitlines()[-1]
    match = re.fullmatch(r"stopped: terminated \(SIGTERM\) at step (\d+); saved step-\1 in [0-9.]+ s; a restart "
                         r"resumes from step-\1", line)
    assert match and "Traceback" not in err, err[-3000:]
    saved = int(match.group(1))
    assert complete_steps(str(run / "checkpoint")) == [saved]

    flag = tmp_path / "saving"
    job = start(["-c", SLOW_SAVE.format(signal=str(flag))], "--checkpoint.interval", "1")
    out, err = signal_when(job, flag.exists, signal.SIGINT)
    assert job.returncode == 130, err[-3000:]
    assert f"Training starts at step {saved + 1}" in out  # resumed from the step SIGTERM saved
    step = saved + 1
    assert err.splitlines()[-1] == (f"stopped: interrupted (Ctrl-C) at step {step} (during the save of step {step}, "
                                    f"which finished first); a restart resumes from step-{step}")
    assert "Traceback" not in err
    assert complete_steps(str(run / "checkpoint")) == [step, saved]
    step_folder = str(run / "checkpoint" / f"step-{step}")
    assert manifest_faults(step_folder, read_manifest(step_folder)) == []


def test_a_job_without_checkpoints_trains_to_its_end(tmp_path):
    """No checkpoint is ever saved, so no manifest is waited for (the benchmarks train so)."""
    out = train_in_one_process([["--job.config_file", "configs/debug.toml", "--job.dump_folder", str(tmp_path),
                                 "--training.steps", "3", "--training.seq_len", "128", "--checkpoint.no-enable"]])
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / "checkpoint").exists()
    steps = [json.loads(line).get("step") for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(s for s in steps if s is not None) == 3
