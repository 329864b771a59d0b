"""What a run needs to explain itself: its resolved config, command line, commit, library versions and card.

Every process start of a training job that trains a step writes `<dump_folder>/runs/<UTC start time>/`
(at its first step; a rerun with nothing left to train writes none) holding `config.toml`
(the job config after TOML and command-line overrides; `train.py --job.config_file` of it runs the same
job) and `run.json` (train.py's arguments, working directory, commit, card, world size, host, versions).
`metrics.jsonl` gets a `run_start` record at the first step of that start, so a resumed run's records can
be told apart.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from recipe.logs.layout import CONFIG_FILE, RUN_FILE, RUN_START, RUNS_FOLDER
from recipe.toml_config import toml_value

REPO = Path(__file__).resolve().parents[2]
# Distributions whose versions decide what a run computes, in the order run.json lists them.
LIBRARIES = ("torch", "torchtitan", "torchdata", "triton", "flash-attn", "datasets", "tyro")
NOT_INSTALLED = "not installed"


COMMIT_ENV = "LIGHTHOUSE_SOURCE_COMMIT"


def source_commit(repo: Path = REPO) -> str:
    """Short hash of `repo`'s HEAD, with "-dirty" when tracked files differ from it; "unknown" outside git.

    "-dirty" matters when a tree is copied to another machine: the HEAD there may not be the code that ran. A copy
    whose git metadata is missing or stale names its commit in the environment variable COMMIT_ENV, which wins.
    """
    if named := os.environ.get(COMMIT_ENV, "").strip():
        return named

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0 or not head.stdout.strip():
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def library_versions() -> dict[str, str]:
    """Python, every one of LIBRARIES ("not installed" for an absent one, so a record says what it ran without),
    and the CUDA and cuDNN builds torch uses ("none" without CUDA)."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = NOT_INSTALLED
    versions["cuda"] = torch.version.cuda or "none"
    versions["cudnn"] = str(torch.backends.cudnn.version()) if torch.cuda.is_available() else "none"
    return versions


def card() -> str:
    """The name of the device this process trains on, as torchtitan's device module gives it (the CPU
    without an accelerator, see recipe/compat/cpu.py)."""
    from torchtitan.tools import utils  # the module attribute, which the CPU compatibility layer may repoint

    return utils.device_module.get_device_name()


def to_toml(sections: dict[str, dict[str, Any]]) -> str:
    """`sections` (name -> {key: value}, a dict value being a sub-table) as a TOML document.

    TOML has no null: a key set to None is written as a comment, so reading the file gives that key's
    default (None for almost every torchtitan key that can hold it; run.json's command has the exact value).
    """
    lines: list[str] = []

    def table(name: str, values: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        for key, value in values.items():
            if value is None:
                lines.append(f"# {key} = None (TOML has no null)")
            elif not isinstance(value, dict):
                lines.append(f"{key} = {toml_value(value)}")
        lines.append("")
        for key, value in values.items():
            if isinstance(value, dict):
                table(f"{name}.{key}", value)

    for name, values in sections.items():
        table(name, values)
    return "\n".join(lines)


def write_run_record(job_config: Any, argv: Sequence[str] | None = None, now: datetime.datetime | None = None,
                     tokenizer: str | None = None, lighthouse_layers: Sequence[int] | None = None) -> Path:
    """Write this start's `config.toml` and `run.json` under `<dump_folder>/runs/` and return their folder.

    `argv` is the job's arguments to train.py (default: this process's); the folder is named by the UTC
    start time, with a suffix when a start in the same second already took that name. `tokenizer`: what
    identifies the tokenizer's ids (`recipe.data.tokenizer.tokenizer_fingerprint`), so a resume can check it.
    `lighthouse_layers`: the model's layers that run Lighthouse before any switch to dense, so that a tool can tell
    how a checkpoint trained without building the model (`eval.checkpoint_record`).
    """
    now = now or datetime.datetime.now(datetime.timezone.utc)
    runs = Path(job_config.job.dump_folder) / RUNS_FOLDER
    runs.mkdir(parents=True, exist_ok=True)
    stamp = now.strftime("%Y%m%d-%H%M%S")
    folder, n = runs / stamp, 1
    while True:
        try:
            folder.mkdir()
            break
        except FileExistsError:
            n += 1
            folder = runs / f"{stamp}-{n}"
    args = list(sys.argv[1:] if argv is None else argv)
    (folder / CONFIG_FILE).write_text(to_toml(job_config.to_dict()), encoding="utf-8")
    record = {
        "start": now.isoformat(timespec="seconds"),
        "command": shlex.join(["train.py", *args]),
        "cwd": os.getcwd(),
        "commit": source_commit(),
        "card": card(),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "host": platform.node(),
        "versions": library_versions(),
        **({"tokenizer": tokenizer} if tokenizer else {}),
        **({"lighthouse_layers": list(lighthouse_layers)} if lighthouse_layers is not None else {}),
    }
    (folder / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return folder


def run_start_record(step: int, record_folder: Path) -> dict[str, Any]:
    """The `metrics.jsonl` record that marks where a process start's steps begin: its first step, the
    start time and commit from its run.json, and that folder relative to the dump folder."""
    record = json.loads((record_folder / RUN_FILE).read_text(encoding="utf-8"))
    return {"event": RUN_START, "step": step, "time": record["start"], "commit": record["commit"],
            "record": f"{RUNS_FOLDER}/{record_folder.name}"}


def recorded_tokenizer(record_folder: Path) -> str | None:
    """The tokenizer a run record's start trained with (`tokenizer` in its run.json), None where it names none or
    cannot be read."""
    try:
        record = json.loads((Path(record_folder) / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record.get("tokenizer") if isinstance(record, dict) else None
