"""Command-line plumbing shared by the evaluation scripts (niah.py, heldout_loss.py, causality_audit.py).

Each script takes its own options plus, after them, torchtitan-style job arguments
(`--job.config_file X --lighthouse.no-enable --lighthouse.topk 512 ...`) that set the model and the
attention setting the checkpoint is evaluated with.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import torch
from torchtitan.config import JobConfig

from eval.checkpoint import build_model, load_weights, logits_function, parse_job_config
from eval.checkpoint_run import job_config_of
from eval.device import pick_device
from eval.metrics.heldout import LogitsFn
from eval.options import output_file
from recipe.train.cli import ConfigError, as_config_error, config_file_arg


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (`<script>: error: <message>`, pointing at
    `--help`), exit code 2, without the usage block argparse prints first."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (--help lists the options)", file=sys.stderr, flush=True)
        raise SystemExit(2)


def evaluation_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every evaluation script shares."""
    p = argparse.ArgumentParser(description=description, allow_abbrev=False,
                                epilog="Other arguments are job arguments, e.g. --job.config_file configs/debug.toml "
                                       "--lighthouse.no-enable")
    p.add_argument("--checkpoint", required=True, help="a step folder, e.g. outputs/run/checkpoint/step-400")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    p.add_argument("--out", required=True, type=output_file, help="output path prefix (.json, and .png where drawn)")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                   help="no progress on stderr (default: a bar on a terminal, else a line every few seconds)")
    return p


def check_checkpoint_folder(checkpoint: str | Path) -> None:
    """A `--checkpoint` that is not a folder is a ConfigError saying whether anything is there."""
    path = Path(checkpoint)
    if not path.is_dir():
        found = "it is a file" if path.exists() else "it does not exist"
        raise ConfigError(f"--checkpoint={str(checkpoint)!r} is not a folder: {found} (a step folder such as "
                          "outputs/run/checkpoint/step-400)")


def checkpoint_job_config(checkpoint: str, job_argv: list[str]) -> tuple[JobConfig, Path | None]:
    """The job config of the run that wrote `--checkpoint` and its record folder (`eval.checkpoint_run.job_config_of`).
    Without `--job.config_file` the record beside the folder is the only source, so a folder that is not there is
    named first (else: "has no run record")."""
    if config_file_arg(job_argv) is None:
        check_checkpoint_folder(checkpoint)
    return job_config_of(Path(checkpoint), job_argv)


def evaluation_job_config(checkpoint: str, job_argv: list[str]) -> JobConfig:
    """The job an evaluation runs: the one the job arguments name; without `--job.config_file`, the run record's of
    the checkpoint under the job arguments (`checkpoint_job_config`), not torchtitan's defaults (another model)."""
    if config_file_arg(job_argv) is not None:
        return parse_job_config(job_argv)
    return checkpoint_job_config(checkpoint, job_argv)[0]


def load_checkpoint(checkpoint: str | Path, device_name: str, job_config: JobConfig
                    ) -> tuple[torch.nn.Module, LogitsFn, torch.device]:
    """(model, logits function, device) for the checkpoint (fused kernels on a GPU, as in training); a
    `--checkpoint` that is not a folder, or not a checkpoint of this model, is a ConfigError. Scripts check their
    other options before this, so a mistake there is named before any model is built."""
    check_checkpoint_folder(checkpoint)
    device = pick_device(device_name)
    model = build_model(job_config, device)
    with as_config_error():
        load_weights(model, checkpoint)
    return model, logits_function(model, job_config, device), device
