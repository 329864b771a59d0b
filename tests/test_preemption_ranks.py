"""SIGTERM under torchrun: a rank other than 0 removes the traceback torchelastic already wrote to its error file
before it closes its trainer, and rank 0 dates its line when the stop was decided, so torchrun's summary heads with
rank 0's line."""
import json
import os
import time
from pathlib import Path

import pytest

from recipe.cli import DEBUG_ENV, OTHER_RANKS_WAIT_S, exit_on_config_error
from recipe.preemption import Terminated


class EndedAtOnce(Exception):
    """Stands in for `os._exit`, which would end pytest too."""


def end_at_once(code: int) -> None:
    raise EndedAtOnce(code)


def test_a_rank_other_than_0_drops_the_traceback_torchelastic_recorded_before_it_waits(monkeypatch, tmp_path):
    """torchelastic's @record on Trainer.train writes the traceback first; the rank leaves rank 0 the summary."""
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {"message": "Traceback (most recent call last): ...",
                                                  "extraInfo": {"py_callstack": "...", "timestamp": "1"}}}))
    waits = []  # (seconds, whether the error file existed then)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setattr(time, "sleep", lambda seconds: waits.append((seconds, error_file.exists())))
    monkeypatch.setattr(os, "_exit", end_at_once)
    with pytest.raises(EndedAtOnce) as exit_info, exit_on_config_error():
        raise Terminated("terminated (SIGTERM) at step 3; saved step-3 in 1.0 s; a restart resumes from step-3")
    assert exit_info.value.args == (143,) and waits == [(OTHER_RANKS_WAIT_S, False)]


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
    assert record["message"] == f"error: {stop}"


@pytest.mark.parametrize("rank, kept", [("1", False), ("0", True)])
def test_a_stopped_rank_other_than_0_drops_its_recorded_traceback_before_closing_the_trainer(
        monkeypatch, tmp_path, rank, kept):
    from recipe.trainer import main

    error_file = tmp_path / "error.json"
    seen_at_close = []

    class StoppedTrainer:
        step = 3

        def __init__(self, config, args):
            pass

        def train(self):
            error_file.write_text("{}")  # what torchelastic's @record on Trainer.train writes as the stop leaves it
            raise Terminated("terminated (SIGTERM) at step 3; a restart resumes from step-3")

        def close(self):
            seen_at_close.append(error_file.exists())

    monkeypatch.setenv(DEBUG_ENV, "1")  # the stop propagates: this test looks at what happened before
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    with pytest.raises(Terminated):
        main(["--job.config_file", str(Path(__file__).parents[1] / "configs" / "debug.toml"),
              "--job.dump_folder", str(tmp_path / "run")],
             trainer_cls=StoppedTrainer)
    assert seen_at_close == [kept]
