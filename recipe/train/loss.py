"""The `[loss]` choice between the full loss (logits, then torchtitan's cross-entropy) and the fused output loss
(`models.linear_cross_entropy` inside the model's output layer), and the loss function torchtitan calls on what the
model returned.

With the fused loss the trainer hands the labels to the model (`with_labels`), whose output layer returns per-token
nats; the loss function sums them. Both give the local loss sum that torchtitan divides by the global count of
tokens, so data and context parallelism, gradient accumulation and validation see the same number either way.
"""
from __future__ import annotations

from typing import Any

import torch
from torchtitan.components.loss import cross_entropy_loss
from torchtitan.tools.logging import logger

FLOAT32_BYTES = 4


def full_logits_gib(tokens: int, vocab_size: int) -> float:
    """GiB of the float32 logits the full loss makes for `tokens` tokens of one rank."""
    return tokens * vocab_size * FLOAT32_BYTES / 2**30


def uses_fused_loss(job_config, tokens: int, vocab_size: int) -> bool:
    """Whether a forward of `tokens` tokens per rank computes its loss fused: `[loss] implementation` "fused", or
    "auto" where the full float32 logits would exceed `[loss] fused_above_gib` (the fused loss needs the whole
    output weight on the rank: never under tensor or pipeline parallelism, which `check_loss` refuses for "fused")."""
    loss, parallelism = job_config.loss, job_config.parallelism
    if loss.implementation != "auto":
        return loss.implementation == "fused"
    if parallelism.tensor_parallel_degree > 1 or parallelism.pipeline_parallel_degree > 1:
        return False
    return full_logits_gib(tokens, vocab_size) > loss.fused_above_gib


def tokens_per_rank(job_config, local_batch_size: int, seq_len: int) -> int:
    """Tokens one rank's forward holds: a microbatch's, split over the context-parallel ranks."""
    return local_batch_size * seq_len // job_config.parallelism.context_parallel_degree


def with_labels(extra_kwargs: dict[str, Any], labels: torch.Tensor, fused: bool) -> dict[str, Any]:
    """The model's keyword arguments, with `labels` (as sharded for this rank) where the loss is fused."""
    return {**extra_kwargs, "labels": labels} if fused else extra_kwargs


def lighthouse_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss sum of what the model returned: per-token nats from the fused output layer (`pred` shaped as
    `labels`, 0 at ignored labels), else logits, through torchtitan's cross-entropy (sum reduction)."""
    if pred.dim() == labels.dim():
        return pred.sum()
    return cross_entropy_loss(pred, labels)


def build_lighthouse_loss(job_config, **kwargs):
    """TrainSpec loss builder (torchtitan's `build_cross_entropy_loss`, also compiled where `[compile] components`
    names the loss)."""
    del kwargs
    if job_config.compile.enable and "loss" in job_config.compile.components:
        logger.info("Compiling the loss function with torch.compile")
        return torch.compile(lighthouse_loss, backend=job_config.compile.backend)
    return lighthouse_loss
