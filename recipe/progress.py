"""Progress of work that takes more than a few seconds (NIAH, held-out loss, the causality audit, sweeps).

On stderr, so stdout keeps only the results. On a terminal a tqdm bar; off one (a log file, CI, SLURM) a line
`<desc>: n/total (p%), t s` every `LINE_EVERY_S` seconds while the work runs and one when it ends, so a log is
never silent for long and short work prints nothing. `show=None` chooses by stderr, `True` always draws the
bar, `False` shows nothing (the scripts' `--no-progress`).
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Protocol

from tqdm import tqdm

LINE_EVERY_S = 5.0


class Progress(Protocol):
    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


class ProgressLines:
    """A bar's stand-in off a terminal: `update()` after each step, `close()` at the end; a line at most every
    `every` seconds (`clock` gives seconds), and a last one at `close` if any was printed."""

    def __init__(self, total: int, desc: str, every: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.every, self.clock = total, desc, every, clock
        self.start = self.last = clock()
        self.n, self.shown = 0, None

    def line(self, now: float) -> None:
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        print(f"{self.desc}: {self.n}/{self.total}{share}, {now - self.start:.0f} s", file=sys.stderr, flush=True)
        self.last, self.shown = now, self.n

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last >= self.every:
            self.line(now)

    def close(self) -> None:
        if self.shown is not None and self.shown != self.n:
            self.line(self.clock())


def progress_bar(total: int, desc: str, show: bool | None = None) -> Progress:
    """Progress of `total` steps named `desc`: a bar or, off a terminal with `show=None`, lines (module doc)."""
    if show is None and not sys.stderr.isatty():
        return ProgressLines(total, desc)
    return tqdm(total=total, desc=desc, file=sys.stderr, disable=not show and show is not None, dynamic_ncols=True)


SLOW_STEP_S = 30.0  # a training step longer than this gets a line of its own between torchtitan's metrics lines


def first_step_line(step: int, tokens: int, device: str) -> str:
    """The line before the first step a job trains (`tokens` a microbatch per rank): on a CPU, or at long context,
    it can take minutes."""
    return (f"step {step} started: {tokens:,} tokens a microbatch on {device}; torchtitan logs when it ends, "
            f"and a step over {SLOW_STEP_S:.0f} s between its metrics lines gets a line of its own")


def slow_step_line(step: int, seconds: float, logged: bool) -> str | None:
    """A line for a training step that took over `SLOW_STEP_S` seconds and that torchtitan's metrics did not log."""
    if logged or seconds <= SLOW_STEP_S:
        return None
    return f"step {step} done in {seconds:.0f} s (metrics every metrics.log_freq steps)"
