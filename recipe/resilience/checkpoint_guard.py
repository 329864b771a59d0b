"""Loading and saving a job's own checkpoints with the mistakes named: each save is recorded in a manifest
of its files (`recipe.resilience.checkpoint_manifest`), a resume checks the manifest before it loads (a step without one
is damaged unless `[checkpoint] load_unverified`), a newest checkpoint that is damaged or cannot be loaded
gives way to the newest older one that can (with a warning naming what failed), and a save that fails on a
full disk says so in one line.

The trainer routes torchtitan's `CheckpointManager.load` and `.save` through `load_newest_intact` and
`save_or_stop`. Only an automatic resume (`checkpoint.load_step = -1`) falls back; a step asked for by
number loads that step or fails, and so does `checkpoint.initial_load_path` (a checkpoint of another job, which
loads without a manifest too, with a warning).
"""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import warnings
from typing import Any, Callable, Iterable

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torchtitan.tools.logging import logger

from recipe.errors import RunStopped
from recipe.resilience.checkpoint_manifest import checkpoint_faults, read_manifest, unverified_reason

_STEP_FOLDER = re.compile(r"step-(\d+)")
OVERWRITE_WARNING = "Detected an existing checkpoint in .*, overwriting"  # DCP's, two lines at each such save
FULL_DISK_FREE_BYTES = 64 * 2**20  # a save that fails with less free space than this failed for want of it


class CheckpointError(RunStopped):
    """A checkpoint that cannot be loaded, or a save that cannot be written."""


class DataParallelMismatch(CheckpointError):
    """A checkpoint of a run with another data-parallel degree: not damage, so no older step is tried."""


def _step_folders(folder: str) -> dict[int, bool]:
    """Each `step-N` folder of `folder` by step, and whether it holds `.metadata` (the file DCP writes last)."""
    if not os.path.isdir(folder):
        return {}
    return {int(m.group(1)): os.path.isfile(os.path.join(folder, name, ".metadata"))
            for name in os.listdir(folder) if (m := _STEP_FOLDER.fullmatch(name))}


def complete_steps(folder: str) -> list[int]:
    """Steps of `folder`'s complete checkpoints (`step-N/.metadata`), newest first."""
    return sorted((step for step, complete in _step_folders(folder).items() if complete), reverse=True)


def unfinished_steps(folder: str) -> list[int]:
    """Steps of `folder` whose folder has no `.metadata`: saves that never finished, which a resume skips."""
    return sorted(step for step, complete in _step_folders(folder).items() if not complete)


def _first_line(err: BaseException) -> str:
    """The error's type and the last line of its message (DCP puts the remote traceback first, the cause last)."""
    text = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {text[-1].strip() if text else ''}".rstrip(": ")


def _damage(path: str, checksums: bool, unverified: bool) -> str | None:
    """What makes the checkpoint `path` damaged (`checkpoint_faults`), in one phrase; None if intact."""
    faults = checkpoint_faults(path, checksums, unverified)
    if not faults:
        return None
    return faults[0] + (f" and {len(faults) - 1} more" if len(faults) > 1 else "")


def resume_step(folder: str, unverified: bool = False) -> int | None:
    """The step a restart of the job writing `folder` resumes from: its newest complete checkpoint whose manifest
    lists every file at its size (checksums are left to the resume); None if there is none. On one rank alone."""
    return next((step for step in complete_steps(folder)
                 if not checkpoint_faults(os.path.join(folder, f"step-{step}"), False, unverified)), None)


def weights_only(keys: Iterable[str]) -> bool:
    """Whether a checkpoint's state-dict keys (its `.metadata`) hold model weights alone, as a save with
    `checkpoint.last_save_model_only` writes them: no train state (step, LR schedule), so nothing resumes from it."""
    return not any(key.startswith("train_state") for key in keys)


def checkpoint_entries(path: str, key: str) -> dict[str, Any]:
    """The state-dict entries (name -> metadata) of the checkpoint folder `path`, the value of `key`, read from its
    `.metadata` alone; ValueError naming both, in one line, when it has none or one that cannot be read."""
    try:
        return FileSystemReader(path).read_metadata().state_dict_metadata
    except FileNotFoundError as err:
        raise ValueError(f"{key}={path!r} is not a checkpoint (no .metadata)") from err
    except Exception as err:  # noqa: BLE001  (a damaged .metadata raises whatever unpickling meets)
        raise ValueError(f"{key}={path!r} has a .metadata that cannot be read "
                         f"({type(err).__name__}: {' '.join(str(err).split())})") from err


def check_entry_shapes(entries: dict[str, Any], shapes: dict[str, tuple[int, ...]], path: str, key: str,
                       model: str) -> None:
    """Every parameter of `shapes` (name -> shape in the model described by `model`) that the checkpoint `path`
    (the value of `key`) holds has that shape; ValueError naming the first that does not: another model's
    checkpoint, which DCP would only refuse after loading, with a traceback."""
    for name, shape in shapes.items():
        saved = getattr(entries.get(name), "size", None)
        if saved is not None and tuple(saved) != shape:
            raise ValueError(f"{key}={path!r} holds {name} of shape {list(saved)}, but {model} has {list(shape)}: "
                             "it is another model's checkpoint; set model.flavor (and [lighthouse]) to those of the "
                             "run that wrote it")


def finished_weights(folder: str, steps: int, unverified: bool = False) -> bool:
    """Whether a restart of the job writing `folder` would resume its last step (`steps`) saved as weights alone
    (`checkpoint.last_save_model_only`): the run finished, and that step has no optimizer, schedule or data position
    to load, nor anything left to train."""
    if resume_step(folder, unverified) != steps:
        return False
    return weights_only(checkpoint_entries(os.path.join(folder, f"step-{steps}"), "checkpoint.folder"))


def _no_metadata_tracebacks(record: logging.LogRecord) -> bool:
    """Log filter: DCP logs a traceback for each `.metadata` it cannot read before it raises; the failure is
    named in one line by the caller."""
    return not record.getMessage().startswith(("Global metadata is not found", "Rank local metadata is not found"))


def _load_checked(load: Callable[[int], bool], path: str, step: int, checksums: bool, unverified: bool) -> bool:
    """`load(step)` of the checkpoint `path` once its manifest says it is intact (or, if `unverified`, it has
    none: loaded with a warning); CheckpointError otherwise, and for a checkpoint written with another number of
    data-parallel ranks (no older one would differ)."""
    if (damage := _damage(path, checksums, unverified)) is not None:
        raise CheckpointError(f"{path} is damaged: {damage}")
    if os.path.isfile(os.path.join(path, ".metadata")) and (why := unverified_reason(read_manifest(path), checksums)):
        logger.warning(f"{path}: {why}; loading it unverified")
    root = logging.getLogger()
    root.addFilter(_no_metadata_tracebacks)
    try:
        return load(step)
    except (Exception, CheckpointException) as err:  # what DCP raises for a damaged file varies
        if "dataloader.dp_rank_" in str(err):
            raise DataParallelMismatch(f"{path} was written by a run with another number of data-parallel ranks "
                                       f"({_first_line(err)}); resume it with as many ranks as wrote it") from err
        raise CheckpointError(f"{path} cannot be loaded ({_first_line(err)})") from err
    finally:
        root.removeFilter(_no_metadata_tracebacks)


def load_newest_intact(load: Callable[[int], bool], folder: str, step: int = -1, initial_load_path: str = "",
                       checksums: bool = True, unverified: bool = False) -> bool:
    """`load(step)`, each checkpoint checked against its manifest first; for `step` -1, the newest complete
    checkpoint of `folder` that is intact and loads, warning for each newer one that is not and for step folders
    without `.metadata`. A step of `folder` without a manifest is damaged unless `unverified`; an
    `initial_load_path` without one loads with a warning. CheckpointError when none loads, or the one asked for
    (by step, or as `initial_load_path` of a job whose `folder` does not exist yet) is damaged."""
    if not os.path.exists(folder):
        if not initial_load_path:
            return load(step)
        try:
            return _load_checked(load, initial_load_path, step, checksums, unverified=True)
        except CheckpointError as err:
            raise CheckpointError(f"checkpoint.initial_load_path: {err}") from err
    if unfinished := unfinished_steps(folder):
        logger.warning(f"{folder}: {', '.join(f'step-{s}' for s in unfinished)} has no .metadata (a save that did not "
                       "finish): not a checkpoint to resume from")
    if step != -1:
        return _load_checked(load, os.path.join(folder, f"step-{step}"), step, checksums, unverified)
    steps = complete_steps(folder)
    if not steps:
        return load(step)
    *newer, oldest = steps
    for candidate, older in zip(newer, steps[1:]):
        try:
            return _load_checked(load, os.path.join(folder, f"step-{candidate}"), candidate, checksums, unverified)
        except DataParallelMismatch:
            raise
        except CheckpointError as err:
            logger.warning(f"{err}; trying step-{older}")
    try:
        return _load_checked(load, os.path.join(folder, f"step-{oldest}"), oldest, checksums, unverified)
    except DataParallelMismatch:
        raise
    except CheckpointError as err:
        raise CheckpointError(f"{err} and no older complete checkpoint is left to resume from") from err


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
    message is a file-position mismatch), anything else propagates. DCP's warning that the save overwrites an
    existing step folder is silenced (for the asynchronous writer's thread too, hence a filter of the process):
    a job saves a step again only after its resume started before it (a damaged step passed over, or an older
    `checkpoint.load_step`), which its own lines have named."""
    warnings.filterwarnings("ignore", message=OVERWRITE_WARNING, category=UserWarning)
    try:
        save(curr_step, last_step)
    except (Exception, CheckpointException) as err:  # DCP reports a rank's failure as a CheckpointException
        if not _disk_full(err, folder):
            raise
        raise CheckpointError(f"saving step {curr_step} into {folder} failed: the disk is full; free space, then "
                              "restart (the job resumes from its latest complete checkpoint)") from err
