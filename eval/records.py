"""What the JSON records of evaluations and measurements carry so that a number can be traced back (command,
commit, device, versions, date), and how they are written."""
from __future__ import annotations

import datetime
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torchtitan
from torchtitan.config import JobConfig

from eval.checkpoint_record import lighthouse_setting
from recipe.logs.run_record import REPO, source_commit


def command_line() -> str:
    """This process's command line, the script named without its folder."""
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


def shown_path(path: str | Path) -> str:
    """`path` as a record names it: relative to the repository when inside it, so records do not name the
    machine's checkout."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved)


def provenance(checkpoint: str | Path, job_config: JobConfig, device: torch.device) -> dict[str, Any]:
    """The record of an evaluation of `checkpoint`: command, commit, date, device, torch, model, attention."""
    return {
        "command": command_line(),
        "commit": source_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "checkpoint": str(checkpoint),
        "model": f"{job_config.model.name}/{job_config.model.flavor}",
        "attention": lighthouse_setting(job_config),
    }


def environment(device: torch.device) -> dict[str, str]:
    """The record of a throughput measurement on `device`: card, CUDA, cuDNN, torch, torchtitan, commit, date."""
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"CPU {platform.machine()}",
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()) if device.type == "cuda" else "none",
        "torch": torch.__version__,
        "torchtitan": torchtitan.__version__,
        "commit": source_commit(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def write_json(path: Path, record: Any, indent: int = 2) -> Path:
    """Write `record` as JSON to `path` as named (its folder created); returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=indent) + "\n")
    return path


def write_record(out: Path, record: Any, indent: int = 2) -> Path:
    """Write `record` as JSON to `out` with the suffix .json (its folder created); returns that path."""
    return write_json(out.with_suffix(".json"), record, indent)
