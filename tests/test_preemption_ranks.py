"""SIGTERM under torchrun: no rank records a stop in its error file through torchelastic's @record, a rank other
than 0 leaves rank 0 to end a stop every rank decided, and rank 0 dates its line when the stop was decided, so
torchrun's summary heads with rank 0's line every time; a two-process job under the launcher (`recipe.torchrun`)
shows it, ending in the launcher's one line."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, record

from recipe.compat.torchtitan import without_stop_records
from recipe.data.loader import DataError
from recipe.launch import free_port
from recipe.resilience.checkpoint_guard import complete_steps
from recipe.resilience.checkpoint_manifest import manifest_faults, read_manifest
from recipe.resilience.preemption import Terminated
from recipe.torchrun import exit_code, failure_line, root_cause
from recipe.train.cli import DEBUG_ENV, OTHER_RANKS_WAIT_S, ConfigError, exit_on_config_error

from .helpers import REPO, child_env
from .warm_python import warm_job

STOPPED = re.compile(r"stopped: terminated \(SIGTERM\) at step (\d+); saved step-\1 in [0-9.]+ s; a restart resumes "
                     r"from step-\1")


def logged_steps(metrics: Path) -> list[int]:
    """The steps rank 0 has logged to metrics.jsonl so far (complete lines only)."""
    if not metrics.exists():
        return []
    lines = metrics.read_text().split("\n")[:-1]
    return [record["step"] for record in map(json.loads, lines) if "step" in record and "event" not in record]


def rank_1_of(master_port: int) -> int:
    """The pid of the worker of rank 1 of the torchrun job on `master_port` (read from /proc)."""
    wanted = (b"\0RANK=1\0", f"\0MASTER_PORT={master_port}\0".encode())
    for entry in Path("/proc").iterdir():
        try:
            environ = b"\0" + (entry / "environ").read_bytes() if entry.name.isdigit() else b""
        except OSError:  # a process that has just ended
            continue
        if all(variable in environ for variable in wanted):
            return int(entry.name)
    raise AssertionError(f"no worker of rank 1 under torchrun (port {master_port})")


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_after_the_same_saved_step_and_a_restart_resumes_from_it(tmp_path):
    """SIGTERM reaches rank 1 only; the ranks agree, save that step together and end the job in one line."""
    run, logs = tmp_path / "run", tmp_path / "torchrun"
    metrics = run / "metrics.jsonl"
    env = {**child_env(), "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": "4242"}  # under SLURM, a SIGTERM saves
    env.pop("LIGHTHOUSE_DEBUG", None)
    port = free_port()
    command, env = warm_job(["-m", "recipe.torchrun", "--nproc_per_node=2", "--local-ranks-filter", "0",
                             "--master_port", str(port), "--log-dir", str(logs),
                             "--redirects", "1:3",  # rank 1's output to its own files
                             "train.py", "--job.config_file", "configs/debug.toml", "--job.dump_folder", str(run),
                                  "--training.steps", "1000", "--training.seq_len", "128", "--checkpoint.enable",
                             "--checkpoint.interval", "1000"],  # no save of its own before the signal
                            env)

    def stop_rank_1_after(step: int) -> tuple[str, str, int, str]:
        """Run the command, SIGTERM rank 1 once rank 0 has logged a step past `step`; the job's stdout,
        stderr, the step its one line names, and rank 1's own output."""
        before = set(logs.glob("*/attempt_0/1/stdout.log"))
        job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        deadline = time.monotonic() + 300
        try:
            while not [s for s in logged_steps(metrics) if s > step + 1]:
                assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
                time.sleep(0.05)
            os.kill(rank_1_of(port), signal.SIGTERM)
            out, err = job.communicate(timeout=120)
        finally:
            job.kill()
        lines = [line for line in err.splitlines() if STOPPED.fullmatch(line)]
        assert len(lines) == 1, err[-5000:]  # rank 0 speaks for the job, once
        stopped = int(STOPPED.fullmatch(lines[0]).group(1))
        # the launcher ends with rank 0 as the root cause, its exit code 143, in one line: no traceback at all
        assert job.returncode == 143, err[-5000:]
        assert re.fullmatch(r"torchrun: rank 0 \(pid \d+\) exited with code 143, the job's line above; \d rank\(s\) "
                            "ended with an error", err.splitlines()[-1]), err[-5000:]
        assert "Traceback" not in err, err[-5000:]
        (rank_1,) = set(logs.glob("*/attempt_0/1/stdout.log")) - before
        rank_1_out = rank_1.read_text() + (rank_1.parent / "stderr.log").read_text()
        return out, err, stopped, rank_1_out

    def last_step(output: str) -> int:
        return int(re.findall(r"step:\s+(\d+)\s+loss:", output)[-1])

    out, err, saved, rank_1_out = stop_rank_1_after(0)
    assert last_step(out) == last_step(rank_1_out) == saved, rank_1_out[-3000:]
    assert f"Saving a full checkpoint at last step, step {saved}." in rank_1_out
    assert "Traceback" not in rank_1_out
    assert complete_steps(str(run / "checkpoint")) == [saved]
    step_folder = str(run / "checkpoint" / f"step-{saved}")
    assert manifest_faults(step_folder, read_manifest(step_folder)) == []

    # The same command again: both ranks load the saved step and go on from the next one.
    out, err, again, rank_1_out = stop_rank_1_after(saved)
    assert f"Training starts at step {saved + 1}" in out and f"Training starts at step {saved + 1}" in rank_1_out
    assert last_step(out) == last_step(rank_1_out) == again > saved
    assert complete_steps(str(run / "checkpoint")) == [again, saved]




class EndedAtOnce(Exception):
    """Stands in for `os._exit`, which would end pytest too."""


def end_at_once(code: int) -> None:
    raise EndedAtOnce(code)


@pytest.mark.parametrize("stop, records, code", [
    (Terminated("terminated (SIGTERM) at step 3; saved step-3 in 1.0 s; a restart resumes from step-3"), False, 143),
    (DataError("corpus.jsonl: byte 7 is not UTF-8"), True, 1),
    (ConfigError("training.dataset_path='x' matches no files"), True, 2),
], ids=["sigterm-every-rank", "data-this-rank", "config-this-rank"])
def test_a_rank_other_than_0_ends_after_one_wait_recording_only_a_stop_of_its_own(monkeypatch, tmp_path, stop,
                                                                                    records, code):
    """The wait leaves rank 0 to end the job first (torchrun then stops this rank there). A SIGTERM stop, which
    rank 0 has spoken for, ends after it without an error file: when the SIGTERM was torchrun's own (passed to every
    rank as it stops), no second signal comes to end this rank; a stop of its own is recorded."""
    error_file = tmp_path / "error.json"
    slept = []
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setattr(os, "_exit", end_at_once)
    with pytest.raises(EndedAtOnce) as ended, exit_on_config_error():
        raise stop
    assert slept == [OTHER_RANKS_WAIT_S] and ended.value.args == (code,)
    assert error_file.exists() == records


@pytest.mark.parametrize("failure, recorded", [
    (Terminated("terminated (SIGTERM) at step 3; a restart resumes from step-3"), False),
    (ConfigError("metrics.save_tb_folder='/proc/x': /proc/x cannot be created (No such file or directory)"), False),
    (RuntimeError("a bug"), True),
], ids=["stop", "config-mistake", "crash"])
def test_torchelastic_records_a_crash_of_the_trainer_but_not_a_stop(monkeypatch, tmp_path, failure, recorded):
    """torchtitan's Trainer methods carry torchelastic's @record, which writes any exception to the rank's error
    file, dated when it passes; the trainer calls them without it for a stop, whose line rank 0 writes."""
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))

    @record
    def train(trainer):
        trainer.append("trained")
        raise failure

    calls = []
    with pytest.raises(type(failure)) as raised:
        without_stop_records(train)(calls)
    assert raised.value is failure and calls == ["trained"]
    assert error_file.exists() == recorded
    if recorded:
        assert "a bug" in json.loads(error_file.read_text())["message"]["message"]


def test_rank_0s_line_is_dated_when_the_stop_was_decided_not_after_the_trainer_closed(monkeypatch, tmp_path):
    """torchrun heads its summary with the earliest record: closing a trainer takes seconds, during which another
    rank's traceback could be dated first."""
    error_file = tmp_path / "error.json"
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr(os, "_exit", end_at_once)
    stop = Terminated("terminated (SIGTERM) at step 3; saved step-3 in 1.0 s; a restart resumes from step-3")
    later = stop.raised_at + 7.0  # the trainer closed meanwhile
    monkeypatch.setattr(time, "time", lambda: later)
    with pytest.raises(EndedAtOnce), exit_on_config_error():
        raise stop
    record = json.loads(error_file.read_text())["message"]
    assert record["extraInfo"]["timestamp"] == str(int(stop.raised_at)) != str(int(later))
    assert record["message"] == f"stopped: {stop}"


def test_the_launcher_names_the_rank_that_recorded_why_and_ends_with_its_exit_code(tmp_path, capsys):
    """torchrun's failures as the launcher sums them up: the rank with an error record (rank 0's line), even when
    a rank without one failed first; a rank killed by a signal counts as 128 + its number."""
    record = tmp_path / "error.json"
    record.write_text(json.dumps({"message": {"message": "error: x", "extraInfo": {"py_callstack": "error: x",
                                                                                    "timestamp": "100"}}}))
    killed = ProcessFailure(local_rank=1, pid=11, exitcode=-signal.SIGTERM, error_file=str(tmp_path / "none.json"))
    stopped = ProcessFailure(local_rank=0, pid=10, exitcode=143, error_file=str(record))
    killed.timestamp = 50  # earlier than rank 0's record
    error = ChildFailedError("train.py", {1: killed, 0: stopped})
    assert root_cause(error) == (0, stopped) and exit_code(stopped) == 143
    assert failure_line(error) == ("torchrun: rank 0 (pid 10) exited with code 143, the job's line above; 2 rank(s) "
                                   "ended with an error")
    alone = ChildFailedError("train.py", {1: killed})
    assert exit_code(root_cause(alone)[1]) == 143
    assert failure_line(alone) == "torchrun: rank 1 (pid 11) was killed by SIGTERM; 1 rank(s) ended with an error"
