"""Build the model a job config describes and load a torchtitan DCP checkpoint's weights into it.

The attention setting comes from the job config's `[lighthouse]` section (TOML plus command-line overrides),
not from the checkpoint: Lighthouse has no parameters, so any step folder of the recipe's model loads with
Lighthouse on or off and with any L, p, k.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torchtitan.config import ConfigManager, JobConfig
from torchtitan.protocols.train_spec import get_train_spec

from recipe.resilience.checkpoint_guard import check_entry_shapes, checkpoint_entries
from recipe.train.loss import uses_fused_loss
from recipe.train.train_spec import job_model_args  # importing it registers the llama3_lighthouse TrainSpec
from recipe.train.trainer import check_job


def parse_job_config(argv: list[str]) -> JobConfig:
    """A job config from torchtitan-style arguments (`--job.config_file X --lighthouse.no-enable ...`), checked."""
    job_config = ConfigManager().parse_args(argv)
    check_job(job_config)
    return job_config


def check_lengths(job_config: JobConfig, lengths: list[int]) -> None:
    """Raise ValueError naming the lengths the model cannot run: past the RoPE table or invalid for Lighthouse."""
    max_len = job_config.training.seq_len
    too_long = [n for n in lengths if n > max_len]
    if too_long:
        raise ValueError(f"lengths {too_long} exceed training.seq_len={max_len}, the model's RoPE table; "
                         f"pass --training.seq_len to extend it")
    if job_config.lighthouse.enable:
        config = job_config.lighthouse.to_config()
        for n in lengths:
            try:
                config.validate(n)
            except ValueError as err:
                raise ValueError(f"length {n} does not fit the Lighthouse setting: {err}") from err


def build_model(job_config: JobConfig, device: torch.device) -> nn.Module:
    """The job's model (name, flavor, `[lighthouse]`, `[rope]`, the tokenizer's vocabulary) with freshly initialised
    weights on `device`, in eval mode."""
    with torch.device("meta"):
        model = get_train_spec(job_config.model.name).model_cls(job_model_args(job_config))
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    return model.eval()


def load_weights(model: nn.Module, step_folder: str | Path, key: str = "--checkpoint") -> None:
    """Load the model entries of a torchtitan checkpoint step folder (full or model-only), the value of the
    command line's `key`, into `model`; ValueError naming it when it is no checkpoint, a damaged one or another
    model's (one line, before DCP's tracebacks)."""
    step_folder = Path(step_folder)
    if not (step_folder / ".metadata").is_file():
        raise ValueError(f"{step_folder} is not a DCP checkpoint folder (no .metadata); expected "
                         f"<dump_folder>/<checkpoint.folder>/step-<N>")
    state = model.state_dict()
    entries = checkpoint_entries(str(step_folder), key)
    check_entry_shapes(entries, {name: tuple(t.shape) for name, t in state.items()}, str(step_folder), key,
                       "the job's model")
    if missing := [name for name in state if name not in entries]:
        raise ValueError(f"{key}={str(step_folder)!r} holds no {missing[0]} ({len(missing)} of the job's model's "
                         f"{len(state)} entries missing): it is another model's checkpoint")
    with warnings.catch_warnings():  # DCP warns that it loads in one process, which is what this does
        warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
        dcp.load(state, checkpoint_id=str(step_folder))
    model.load_state_dict(state)


def autocast_dtype(job_config: JobConfig, device: torch.device) -> torch.dtype:
    """The dtype a model runs in for evaluation: the job's mixed-precision dtype on a GPU, as in training; float32
    elsewhere."""
    return getattr(torch, job_config.training.mixed_precision_param) if device.type == "cuda" else torch.float32


class CheckpointScorer:
    """ids [B, T] -> logits [B, T, V] (a logits function), which also scores tokens through the model's output
    layer: `token_nats` with the fused output loss where the job's `[loss]` picks it for that many tokens (no
    [B, T, V] logits), `last_logits` from the last position alone. On a GPU under autocast in the job's
    mixed-precision dtype (`autocast_dtype`), as in training."""

    def __init__(self, model: nn.Module, job_config: JobConfig, device: torch.device) -> None:
        self.model, self.job_config, self.device = model, job_config, device
        self.dtype = autocast_dtype(job_config, device)

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.model(ids.to(self.device))

    def token_nats(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of every label given its inputs: float32 [B, T] on the model's device."""
        ids, labels = ids.to(self.device), labels.to(self.device)
        if uses_fused_loss(self.job_config, ids.numel(), self.model.output.out_features):
            with self.autocast():
                return self.model(ids, labels=labels)
        logits = self(ids).float()
        return F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")

    def last_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] of the last position."""
        with self.autocast():
            return self.model.last_logits(ids.to(self.device))


def logits_function(model: nn.Module, job_config: JobConfig, device: torch.device) -> CheckpointScorer:
    """The checkpoint's logits function (`CheckpointScorer`)."""
    return CheckpointScorer(model, job_config, device)
