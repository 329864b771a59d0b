"""Command-line plumbing shared by the evaluation scripts (niah.py, heldout_loss.py).

Each script takes its own options plus, after them, torchtitan-style job arguments
(`--job.config_file X --lighthouse.no-enable --lighthouse.topk 512 ...`) that set the model and the
attention setting the checkpoint is evaluated with.
"""
from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import torch  # noqa: E402

from torchtitan.config import JobConfig  # noqa: E402

from eval.checkpoint import build_model, lighthouse_setting, load_weights, logits_function, parse_job_config  # noqa: E402
from source_commit import source_commit  # noqa: E402


def int_list(text: str) -> list[int]:
    """Comma-separated integers of a command-line option, e.g. "2048,4096"."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from err


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every evaluation script shares."""
    p = argparse.ArgumentParser(description=description, allow_abbrev=False,
                                epilog="Other arguments are job arguments, e.g. --job.config_file configs/debug.toml "
                                       "--lighthouse.no-enable")
    p.add_argument("--checkpoint", required=True, help="a step folder, e.g. outputs/run/checkpoint/step-400")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    p.add_argument("--out", required=True, type=Path, help="output path prefix (.json, and .png where drawn)")
    return p


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load(args: argparse.Namespace, job_argv: list[str], check: Callable[[JobConfig], None] | None = None):
    """(job config, model, logits function, device) for the checkpoint (fused kernels on a GPU, as in training).

    `check` sees the job config before any model is built (to reject bad options early)."""
    device = pick_device(args.device)
    job_config = parse_job_config(job_argv)
    if check is not None:
        check(job_config)
    model = build_model(job_config, device)
    load_weights(model, args.checkpoint)
    return job_config, model, logits_function(model, job_config, device), device


def provenance(args: argparse.Namespace, job_config, device: torch.device) -> dict:
    """What a number needs to be traced back: command, commit, device, attention setting, date."""
    return {
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": source_commit(REPO),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "checkpoint": str(args.checkpoint),
        "model": f"{job_config.model.name}/{job_config.model.flavor}",
        "attention": lighthouse_setting(job_config),
    }
