"""Ctrl-C (SIGINT) and SIGTERM held back where acting on them at once would leave no line to end with, or half a
save behind: from train.py's first line until the job has read its settings (only then can its line name the
step a restart resumes from), during a checkpoint save, and while a job closes.

A held signal is noted, not acted on, and acted on when the hold ends: `release_ctrl_c` raises KeyboardInterrupt
for a Ctrl-C noted before the settings were read and lets later ones interrupt; the trainer's
`recipe.resilience.preemption.SigtermFlag` takes over a SIGTERM noted before it started (acted on after the first step);
`ctrl_c_held` raises at the end of its block. Only the first Ctrl-C interrupts: later ones are noted and dropped, so a
burst of them ends the job once, in one line. Standard library only, so train.py installs it before any heavy
import.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Iterator

_noted: dict[int, float] = {}  # signal -> when it was first noted while held and not yet acted on
_interrupted = False  # a Ctrl-C has raised KeyboardInterrupt: the job is stopping, later ones are dropped


def _note(signum: int, frame) -> None:
    if not (signum == signal.SIGINT and _interrupted):
        _noted.setdefault(signum, time.monotonic())


def _interrupt(reason: str = "") -> None:
    """Raise KeyboardInterrupt(reason), once: from now on Ctrl-C is dropped."""
    global _interrupted
    _interrupted = True
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _note)
    raise KeyboardInterrupt(*([reason] if reason else []))


def _on_sigint(signum: int, frame) -> None:
    if not _interrupted:
        _interrupt()


def hold_signals(sigterm: bool = True) -> None:
    """Note Ctrl-C, and SIGTERM if `sigterm`, from now on instead of acting on them (train.py's first call)."""
    signal.signal(signal.SIGINT, _note)
    if sigterm:
        signal.signal(signal.SIGTERM, _note)


def release_ctrl_c() -> None:
    """Let Ctrl-C interrupt from now on (once); raise KeyboardInterrupt now for one noted while held. A no-op
    outside the main thread, where Python runs no signal handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _on_sigint)
    if _noted.pop(signal.SIGINT, None) is not None:
        _interrupt("during start-up")


def take_sigterm() -> float | None:
    """When a SIGTERM noted while held came (`time.monotonic`), None if none; it is acted on by the caller."""
    return _noted.pop(signal.SIGTERM, None)


@contextlib.contextmanager
def ctrl_c_held(what: str, act: bool = True) -> Iterator[None]:
    """Inside, Ctrl-C is noted; if one came, KeyboardInterrupt(`what`) is raised once the block has finished
    (dropped unless `act`: a job that is stopping anyway ends with its own line). Outside the main thread,
    nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if _noted.pop(signal.SIGINT, None) is not None and act and not _interrupted:
        _interrupt(what)
