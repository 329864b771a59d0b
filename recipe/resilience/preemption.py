"""SIGTERM and Ctrl-C without a traceback or a broken save.

SIGTERM is what SLURM sends a job before it kills it at its time limit or on preemption (and what torchrun
sends its workers when it stops them). `SigtermFlag` notes it; the trainer asks `requested()` between steps
(every rank at once, so all ranks stop at the same step), saves that step if `[resilience]` says so and the
save can finish in the grace, and ends with `Terminated` (exit 143). A second SIGTERM ends the process at
once (exit 143, one line): a step folder it leaves half-written has no `.metadata`, so no resume takes it.
A SIGTERM that came before the trainer started (train.py holds it from its first line,
`recipe.resilience.held_signals`) is acted on after the first step.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist

from recipe.errors import RunStopped, speaks_for_the_job
from recipe.resilience.held_signals import take_sigterm


class Terminated(RunStopped):
    """SIGTERM during a job (the ranks agree on the step it stops after)."""

    exit_code = 143
    every_rank = True
    prefix = "stopped"


def save_on_sigterm(setting: str) -> bool:
    """Whether `[resilience] save_on_sigterm` saves: "on", or "auto" under SLURM."""
    return setting == "on" or (setting == "auto" and "SLURM_JOB_ID" in os.environ)


class SigtermFlag:
    """Notes the first SIGTERM this process gets (in the main thread, where Python runs signal handlers, from
    construction on, or held before it); a second one ends the process at once, in one line naming where a
    restart resumes (`resumes()`). After `join_ranks`, `requested` is collective in a job of several processes."""

    def __init__(self, resumes: Callable[[], str]) -> None:
        self.received_at: float | None = take_sigterm()
        self.resumes = resumes
        self.group = None
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def close(self) -> None:
        """Give SIGTERM back the handler it had before (the trainer closes before a job that stops ends, so
        torchrun's SIGTERM to the other ranks of a stopped job ends them at once, as `recipe.train.cli` expects)."""
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None

    def join_ranks(self) -> None:
        """Let every rank ask together (once the default process group exists; every rank calls this)."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self.group = dist.new_group(backend="gloo")  # on the host: asking never waits for the device

    def _on_sigterm(self, signum: int, frame) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            return
        if speaks_for_the_job():  # wherever the job is (a save included): no clean-up, no traceback
            print(f"stopped: terminated (SIGTERM twice): stopped at once; a restart resumes from {self.resumes()}",
                  file=sys.stderr, flush=True)
        os._exit(Terminated.exit_code)

    def any_rank(self, value: bool) -> bool:
        """Whether `value` is true on any rank (every rank must ask, at the same point)."""
        got = torch.tensor([int(value)])
        if self.group is not None:
            dist.all_reduce(got, op=dist.ReduceOp.MAX, group=self.group)
        return bool(got.item())

    def requested(self) -> bool:
        """Whether any rank has had SIGTERM (every rank must ask, at the same point)."""
        got = self.any_rank(self.received_at is not None)
        if got and self.received_at is None:
            self.received_at = time.monotonic()
        return got

    def slowest(self, seconds: float) -> float:
        """The largest `seconds` any rank passes (every rank must ask, at the same point)."""
        value = torch.tensor([seconds], dtype=torch.float64)
        if self.group is not None:
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return value.item()

    def seconds_since(self) -> float:
        """Seconds since this process had SIGTERM (or learnt that another rank had)."""
        return time.monotonic() - (self.received_at or time.monotonic())


