"""The two ways a job ends on purpose with one line instead of a traceback: a mistake in its settings, found at
start-up, and a stop after it started; which processes print that line, and `exit_on_config_error`, which prints
it (and hands it to torchrun); `file_in_the_way`, the start-up check of a folder a job is to write. Standard library
only (train.py and the scripts use it before anything heavy)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Iterator

DEBUG_ENV = "LIGHTHOUSE_DEBUG"
# What the messages of a device allocation that failed say: torch's own and those of allocations outside its caching
# allocator (cuBLAS and cuDNN workspaces, NCCL buffers: "Failed to CUDA calloc async 24 bytes").
ALLOCATION_FAILURES = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                       "Failed to CUDA calloc")


class ConfigError(ValueError):
    """A mistake in a job's configuration, reported as one line (exit code 2) rather than a traceback."""

    every_rank = False  # a rank may meet it alone (a path missing on its node)


def file_in_the_way(path: str) -> str | None:
    """`path` or the nearest of its parents that exists, if that is not a folder (a file where a folder is to be
    created: the first save would fail on it with NotADirectoryError)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return None if os.path.isdir(probe) else probe


class RunStopped(RuntimeError):
    """A job that stops on purpose after it started (a non-finite step, unreadable data, Ctrl-C), reported as
    one line (exit code `exit_code`) rather than a traceback. `raised_at`: when the stop was decided (every
    rank decides a SIGTERM stop after the same step), which dates the line in torchrun's summary."""

    exit_code = 1
    every_rank = False  # whether every rank of a job decides this stop at the same step (rank 0 speaks for all)
    prefix = "error"  # "stopped" for a stop that was asked for (a signal), which is no failure of the job

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.raised_at = time.time()


def speaks_for_the_job() -> bool:
    """Whether this process prints the line a job ends with: every process outside torchrun, rank 0 alone under
    torchrun (whose failure summary names that line for the job)."""
    return os.environ.get("RANK", "0") == "0" or "TORCHELASTIC_RUN_ID" not in os.environ


def debug_enabled() -> bool:
    """True when `LIGHTHOUSE_DEBUG` is set (to anything but "" or "0"): errors keep their traceback."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


OTHER_RANKS_WAIT_S = 5.0  # how long a rank other than 0 leaves rank 0 to end the job first (same mistake)


@contextlib.contextmanager
def exit_on_config_error() -> Iterator[None]:
    """Print a ConfigError (or RunStopped) raised inside as `error: <message>` (a stop that was asked for:
    `stopped: <message>`) on stderr and exit with code 2 (or its `exit_code`); outside torchrun every process
    prints it.

    Under torchrun (`TORCHELASTIC_ERROR_FILE` set) rank 0 speaks for the job: it prints the line, writes it
    to torchrun's error file, so torchrun's failure summary names it as the root cause in place of "To enable
    traceback see ...", and ends at once (`os._exit` with streams flushed; the trainer has closed in its own
    `finally`). torchrun then stops every other rank and exits 1, as it does for any failed worker. Every
    other rank first waits `OTHER_RANKS_WAIT_S`: when it meets the same mistake as rank 0 it is stopped
    there, with no error file (torchelastic's @record leaves stops unrecorded: `recipe.compat.torchtitan`), so
    the summary never heads with a stopped rank; when the mistake is its own it then writes its file and ends
    the same way. After a stop every rank decided at the same step (`every_rank`: SIGTERM) it ends after the
    wait with no error file: rank 0 has ended the job by then, or torchrun itself is stopping every rank (a
    SIGTERM to torchrun, passed to each rank once: no second signal comes)."""
    try:
        yield
    except (ConfigError, RunStopped) as err:
        if debug_enabled():
            raise
        line = f"{getattr(err, 'prefix', 'error')}: {err}"
        code = 2 if isinstance(err, ConfigError) else err.exit_code
        rank_0 = os.environ.get("RANK", "0") == "0"
        if speaks_for_the_job():
            print(line, file=sys.stderr, flush=True)
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not error_file:
            raise SystemExit(code) from None
        if not rank_0:
            time.sleep(OTHER_RANKS_WAIT_S)  # rank 0 ends the job first; torchrun then stops this rank
            if err.every_rank:
                _exit_now(code)
        # torchrun's own record format; its summary shows py_callstack, here the one line, dated when the stop
        # was decided (not after the trainer closed): torchrun heads its summary with the earliest record
        stamp = getattr(err, "raised_at", None) or time.time()
        record = {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(stamp))}}
        with open(error_file, "w", encoding="utf-8") as f:
            json.dump({"message": record}, f)
        _exit_now(code)


def _exit_now(code: int) -> None:
    """End the process at once with `code`, its streams flushed (the trainer has closed in its own `finally`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
