"""Command-line plumbing shared by the evaluation scripts (niah.py, heldout_loss.py, causality_audit.py).

Each script takes its own options plus, after them, torchtitan-style job arguments
(`--job.config_file X --lighthouse.no-enable --lighthouse.topk 512 ...`) that set the model and the
attention setting the checkpoint is evaluated with.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

import torch
from torchtitan.config import JobConfig

from eval.checkpoint import build_model, load_weights, logits_function, parse_job_config
from eval.device import pick_device
from eval.heldout import LogitsFn


def evaluation_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every evaluation script shares."""
    p = argparse.ArgumentParser(description=description, allow_abbrev=False,
                                epilog="Other arguments are job arguments, e.g. --job.config_file configs/debug.toml "
                                       "--lighthouse.no-enable")
    p.add_argument("--checkpoint", required=True, help="a step folder, e.g. outputs/run/checkpoint/step-400")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    p.add_argument("--out", required=True, type=Path, help="output path prefix (.json, and .png where drawn)")
    return p


def load_checkpoint(checkpoint: str | Path, device_name: str, job_argv: list[str],
                    check: Callable[[JobConfig], None] | None = None
                    ) -> tuple[JobConfig, torch.nn.Module, LogitsFn, torch.device]:
    """(job config, model, logits function, device) for the checkpoint (fused kernels on a GPU, as in training).

    `check` sees the job config before any model is built (to reject bad options early)."""
    device = pick_device(device_name)
    job_config = parse_job_config(job_argv)
    if check is not None:
        check(job_config)
    model = build_model(job_config, device)
    load_weights(model, checkpoint)
    return job_config, model, logits_function(model, job_config, device), device
