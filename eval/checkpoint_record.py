"""What the files beside a checkpoint say of the run that wrote it, read without torch or torchtitan: the step,
the dump folder, the record of the process start that wrote it, and the attention its steps trained with, in
words. Tools read these before their heavy imports, so a checkpoint they refuse is refused within a second.

A step folder `<dump_folder>/<checkpoint.folder>/step-N` sits beside `<dump_folder>/runs/<start time>/`, one
folder per process start of the job (recipe/logs/run_record.py). The start that wrote step N is the last one in
`metrics.jsonl` whose `run_start` step is at most N (a resumed start begins after the step it loaded); with a
single record folder that one is taken.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from recipe.logs.layout import CONFIG_FILE, METRICS_FILE, RUN_FILE, RUN_START, RUNS_FOLDER, read_metrics
from recipe.toml_config import load_toml

_STEP_FOLDER = re.compile(r"step-(\d+)")
# Job arguments that can change whether a recorded step trained with Lighthouse: with any of them the question
# is left to the job's full parse (eval.checkpoint_run).
DECIDING_FLAGS = ("--lighthouse.", "--training.steps", "--model.", "--job.config_file", "--checkpoint.")


def step_of(step_folder: Path) -> int | None:
    """N of a `step-N` folder; None for a folder named otherwise."""
    match = _STEP_FOLDER.fullmatch(Path(step_folder).name)
    return int(match.group(1)) if match else None


def dump_folder_of(step_folder: Path) -> Path | None:
    """The job's dump folder, two levels above `step_folder` (`<dump_folder>/<checkpoint.folder>/step-N`), if it
    holds a `runs/` folder of run records; else None."""
    dump = Path(step_folder).resolve().parent.parent
    return dump if (dump / RUNS_FOLDER).is_dir() else None


def run_record_of(step_folder: Path) -> Path | None:
    """The record folder (`runs/<start time>`) of the process start that wrote `step_folder`; None when the
    checkpoint has no run records beside it. Raises ValueError when there are several and none can be told
    to be the writer."""
    dump = dump_folder_of(step_folder)
    if dump is None:
        return None
    records = sorted(folder for folder in (dump / RUNS_FOLDER).iterdir() if (folder / CONFIG_FILE).is_file())
    if not records:
        return None
    step = step_of(step_folder)
    metrics = dump / METRICS_FILE
    starts = read_metrics(str(metrics), events=True) if metrics.is_file() else []
    starts = [event for event in starts if event.get("event") == RUN_START]
    if step is not None and starts:
        earlier = [event for event in starts if event["step"] <= step]
        if earlier and (dump / earlier[-1]["record"] / CONFIG_FILE).is_file():
            return dump / earlier[-1]["record"]
    if len(records) == 1:
        return records[0]
    raise ValueError(f"{step_folder}: cannot tell which of the {len(records)} run records in {dump / RUNS_FOLDER} "
                     f"wrote it ({metrics} names no process start at or before this step); pass "
                     f"--job.config_file <one of them>/{CONFIG_FILE}")


def lighthouse_setting(job_config: Any) -> str:
    """A short label of the attention setting, e.g. 'lighthouse L3 p4 k256 m64 norm causal' or 'dense' (of a
    JobConfig, or of a recorded job from `recorded_job`)."""
    section = job_config.lighthouse
    if not section.enable:
        return "dense"
    return (f"lighthouse L{section.levels} p{section.pool} k{section.topk} m{section.tile_budget} {section.scorer}"
            f" {section.selection} (dense layers {list(section.dense_layers)})")


def describe_training(job_config: Any, lighthouse_at_step: bool) -> str:
    """How a checkpoint's weights were trained, in words: 'dense', 'dense from step S+1 after ...', or the
    Lighthouse setting (`lighthouse_at_step`: its last steps ran Lighthouse); a run started from another
    checkpoint names it."""
    setting = lighthouse_setting(job_config)
    switch = job_config.lighthouse.switch_to_dense_at_step
    if lighthouse_at_step:
        text = setting
    elif setting != "dense" and 0 < switch:
        text = f"dense from step {switch + 1}, after {setting} up to step {switch}"
    else:
        text = "dense"
    checkpoint = job_config.checkpoint  # a recorded job leaves out a setting of None (TOML has no null)
    load_path = getattr(checkpoint, "initial_load_path", None)
    return f"{text}; started from {load_path}" if getattr(checkpoint, "enable", False) and load_path else text


def stage1_refusal(step_folder: Path, trained: str) -> str:
    """The one line that refuses to export a checkpoint whose last steps trained with Lighthouse."""
    return (f"{step_folder} was trained with Lighthouse ({trained}): the exported model runs dense attention, whose "
            "logits differ from the ones it trained with; export a stage-2 (dense) checkpoint, or pass "
            "--allow-stage1 to export it anyway")


def recorded_job(record: Path) -> SimpleNamespace:
    """The job of a run record's `config.toml`, as sections of attributes (`job.lighthouse.enable`)."""
    return SimpleNamespace(**{name: SimpleNamespace(**values)
                              for name, values in load_toml(record / CONFIG_FILE).items()
                              if isinstance(values, dict)})


def recorded_lighthouse_training(step_folder: Path, job_argv: list[str]) -> str | None:
    """How `step_folder` was trained (`describe_training`) when its run record alone shows that its last steps
    ran Lighthouse; None when they did not, when no record tells, or when `job_argv` overrides a setting that
    decides it: the job's full parse answers those. The layers that ran Lighthouse are the record's
    `lighthouse_layers` (run.json); a record from before it was kept tells only where `dense_layers` leaves a
    layer below its largest entry (else the model's layer count decides)."""
    if any(arg.startswith(DECIDING_FLAGS) for arg in job_argv):
        return None
    try:
        record = run_record_of(step_folder)
        job = recorded_job(record) if record is not None else None
        lighthouse, steps = job.lighthouse, job.training.steps
        enable, switch, dense = lighthouse.enable, lighthouse.switch_to_dense_at_step, set(lighthouse.dense_layers)
        run = json.loads((record / RUN_FILE).read_text(encoding="utf-8")) if (record / RUN_FILE).is_file() else {}
    except (ValueError, OSError, AttributeError, TypeError):  # unreadable or unexpected: the full parse says why
        return None
    layers = run.get("lighthouse_layers") if isinstance(run, dict) else None
    if isinstance(layers, list):
        some_layer_lighthouse = enable and bool(layers)
    else:
        some_layer_lighthouse = enable and (not dense or dense != set(range(max(dense) + 1)))
    step = step_of(step_folder) or steps
    if not some_layer_lighthouse or 0 < switch < step:
        return None
    return describe_training(job, True)
