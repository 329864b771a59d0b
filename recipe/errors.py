"""The two ways a job ends on purpose with one line instead of a traceback (`recipe.cli.exit_on_config_error`
prints them): a mistake in its settings, found at start-up, and a stop after it started."""
from __future__ import annotations

import time


class ConfigError(ValueError):
    """A mistake in a job's configuration, reported as one line (exit code 2) rather than a traceback."""


class RunStopped(RuntimeError):
    """A job that stops on purpose after it started (a non-finite step, unreadable data, Ctrl-C), reported as
    one line (exit code `exit_code`) rather than a traceback. `raised_at`: when the stop was decided (every
    rank decides a SIGTERM stop after the same step), which dates the line in torchrun's summary."""

    exit_code = 1

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.raised_at = time.time()
