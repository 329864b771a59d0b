"""SIGTERM under torchrun on a rank other than 0: the rank removes the traceback torchelastic already wrote to its
error file before it waits, so torchrun's summary heads with rank 0's line."""
import json
import os
import time

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
