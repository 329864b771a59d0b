"""Loading and saving a job's own checkpoints with the mistakes named: a newest checkpoint that cannot be
loaded gives way to the newest older one that can (with a warning naming the bad step), and a save that
fails on a full disk says so in one line.

The trainer routes torchtitan's `CheckpointManager.load` and `.save` through `load_newest_intact` and
`save_or_stop`. Only an automatic resume (`checkpoint.load_step = -1`) falls back; a step asked for by
number loads that step or fails.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from typing import Callable

from torch.distributed.checkpoint.api import CheckpointException
from torchtitan.tools.logging import logger

from .errors import RunStopped

_STEP_FOLDER = re.compile(r"step-(\d+)")
FULL_DISK_FREE_BYTES = 64 * 2**20  # a save that fails with less free space than this failed for want of it


class CheckpointError(RunStopped):
    """A checkpoint that cannot be loaded, or a save that cannot be written."""


def complete_steps(folder: str) -> list[int]:
    """Steps of `folder`'s complete checkpoints (`step-N/.metadata`, the file DCP writes last), newest first."""
    if not os.path.isdir(folder):
        return []
    steps = [int(m.group(1)) for name in os.listdir(folder)
             if (m := _STEP_FOLDER.fullmatch(name)) and os.path.isfile(os.path.join(folder, name, ".metadata"))]
    return sorted(steps, reverse=True)


def _first_line(err: BaseException) -> str:
    """The error's type and the last line of its message (DCP puts the remote traceback first, the cause last)."""
    text = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {text[-1].strip() if text else ''}".rstrip(": ")


def load_newest_intact(load: Callable[[int], bool], folder: str, step: int = -1) -> bool:
    """`load(step)`; for `step` -1, the newest complete checkpoint of `folder` that loads, warning for each
    newer one that does not. CheckpointError when none loads."""
    steps = complete_steps(folder)
    if step != -1 or not steps:
        return load(step)
    *newer, oldest = steps
    for candidate, older in zip(newer, steps[1:]):
        try:
            return load(candidate)
        except (Exception, CheckpointException) as err:  # what DCP raises for a damaged file varies
            logger.warning(f"{folder}/step-{candidate} cannot be loaded ({_first_line(err)}); trying step-{older}")
    try:
        return load(oldest)
    except (Exception, CheckpointException) as err:
        raise CheckpointError(f"{folder}/step-{oldest} cannot be loaded ({_first_line(err)}) and no older complete "
                              "checkpoint is left to resume from") from err


def _disk_full(err: BaseException, folder: str) -> bool:
    """Whether `err` (or an error it came from) is ENOSPC, or the disk holding `folder` has all but run out."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            return True
        cause = cause.__cause__ or cause.__context__
    probe = folder
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return shutil.disk_usage(probe or ".").free < FULL_DISK_FREE_BYTES


def save_or_stop(save: Callable[[int, bool], None], folder: str, curr_step: int, last_step: bool = False) -> None:
    """`save(curr_step, last_step)`; a failure on a full disk raises CheckpointError saying so (torch's own
    message is a file-position mismatch), anything else propagates."""
    try:
        save(curr_step, last_step)
    except (Exception, CheckpointException) as err:  # DCP reports a rank's failure as a CheckpointException
        if not _disk_full(err, folder):
            raise
        raise CheckpointError(f"saving step {curr_step} into {folder} failed: the disk is full; free space, then "
                              "restart (the job resumes from its latest complete checkpoint)") from err
