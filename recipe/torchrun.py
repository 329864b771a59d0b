"""torchrun that ends in one line: `python -m recipe.torchrun [torchrun's options] train.py [train.py's arguments]`.

torchrun ends a job whose worker failed in its `ChildFailedError` (a traceback and a page-wide summary), and a job it
was signalled to stop (SIGTERM from Slurm or a shell) in its `SignalException` traceback. Both are raised in
torchrun's own process once every rank has ended, so no rank can prevent them. This module runs torchrun's `run` in
its process, with its options, logs and handling of signals (it passes SIGTERM on to the ranks and waits for them)
as they are, and ends either way in one line on stderr after the ranks' own (the recipe's line from rank 0):

    torchrun: rank 0 (pid 4242) exited with code 143, the job's line above; 2 rank(s) ended
    torchrun: stopped by SIGTERM, which every rank was passed; they have ended

with the exit code of the failed rank that recorded why (`recipe.errors.exit_on_config_error`: rank 0 records the
job's line) or else of the first, and 128 + the signal's number for a stop. Anything else torchrun raises (a
rendezvous that fails) keeps its traceback. Slurm's `slurm/train.sbatch` launches this way.
"""
from __future__ import annotations

import signal
import sys
from typing import Sequence

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import parse_args, run

PREFIX = "torchrun:"


NO_RECORD = {"message": "<NONE>"}  # what torchelastic reads for a rank that wrote no error file


def recorded(failure: ProcessFailure) -> bool:
    """Whether the failed rank wrote why in its error file (the job's line, or a traceback torchelastic recorded)."""
    return failure.error_file_data != NO_RECORD


def root_cause(error: ChildFailedError) -> tuple[int, ProcessFailure]:
    """The failed rank that names the job's end: the earliest with a record of why, else the earliest."""
    return min(error.failures.items(), key=lambda item: (not recorded(item[1]), item[1].timestamp, item[0]))


def exit_code(failure: ProcessFailure) -> int:
    """The rank's exit code, 128 + the signal's number for a rank killed by a signal (as a shell reports it)."""
    return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode if failure.exitcode < 0 else 1


def failure_line(error: ChildFailedError) -> str:
    """One line for a job that ended with failed ranks."""
    rank, failure = root_cause(error)
    how = (f"was killed by {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0
           else f"exited with code {failure.exitcode}")
    why = ", the job's line above" if recorded(failure) else ""
    return f"{PREFIX} rank {rank} (pid {failure.pid}) {how}{why}; {len(error.failures)} rank(s) ended with an error"


def main(argv: Sequence[str] | None = None) -> None:
    """torchrun on `argv` (default: this process's arguments), ending in one line and the job's exit code."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        run(args)
    except ChildFailedError as error:
        print(failure_line(error), file=sys.stderr, flush=True)
        raise SystemExit(exit_code(root_cause(error)[1])) from None
    except SignalException as stop:
        print(f"{PREFIX} stopped by {stop.sigval.name}, which every rank was passed; they have ended", file=sys.stderr,
              flush=True)
        raise SystemExit(128 + int(stop.sigval)) from None


if __name__ == "__main__":
    main()
