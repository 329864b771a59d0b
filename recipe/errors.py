"""The two ways a job ends on purpose with one line instead of a traceback (`recipe.cli.exit_on_config_error`
prints them): a mistake in its settings, found at start-up, and a stop after it started; and which processes
print that line. Standard library only (train.py imports it before anything heavy)."""
from __future__ import annotations

import os
import time


class ConfigError(ValueError):
    """A mistake in a job's configuration, reported as one line (exit code 2) rather than a traceback."""

    every_rank = False  # a rank may meet it alone (a path missing on its node)


class RunStopped(RuntimeError):
    """A job that stops on purpose after it started (a non-finite step, unreadable data, Ctrl-C), reported as
    one line (exit code `exit_code`) rather than a traceback. `raised_at`: when the stop was decided (every
    rank decides a SIGTERM stop after the same step), which dates the line in torchrun's summary."""

    exit_code = 1
    every_rank = False  # whether every rank of a job decides this stop at the same step (rank 0 speaks for all)

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.raised_at = time.time()


def speaks_for_the_job() -> bool:
    """Whether this process prints the line a job ends with: every process outside torchrun, rank 0 alone under
    torchrun (whose failure summary names that line for the job)."""
    return os.environ.get("RANK", "0") == "0" or "TORCHELASTIC_RUN_ID" not in os.environ
