"""Stop a run at the first step whose loss or gradient norm is not finite, before that step is checkpointed.

torchtitan's `Trainer.train_step` computes both and logs them on log steps only; a NaN step would still be
saved by the checkpoint that follows it, and every later step would train on NaN. The trainer collects the
step's losses (from `forward_backward_step`) and its gradient norm (`recorded_grad_norms`, around the step)
and calls `check_finite_step` before torchtitan's checkpointer sees the step, so the latest checkpoint stays
the last good one. The check costs one device-to-host copy of two numbers per step; a data-parallel step
already waits for one (torchtitan's token count), and the gradient norm is the same on every rank, so every
rank stops at the same step.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torchtitan.distributed import utils as dist_utils

from .errors import RunStopped


class NonFiniteStep(RunStopped):
    """A training step whose loss or gradient norm is NaN or infinite."""


@contextlib.contextmanager
def recorded_grad_norms() -> Iterator[list[torch.Tensor]]:
    """Inside, each gradient norm torchtitan's train step computes (its `clip_grad_norm_`, which returns the
    norm it clips with) is appended to the list yielded; torchtitan keeps it in a local variable otherwise."""
    clip = dist_utils.clip_grad_norm_
    norms: list[torch.Tensor] = []

    def recording_clip(*args, **kwargs) -> torch.Tensor:
        norm = clip(*args, **kwargs)
        norms.append(norm)
        return norm

    dist_utils.clip_grad_norm_ = recording_clip
    try:
        yield norms
    finally:
        dist_utils.clip_grad_norm_ = clip


def check_finite_step(step: int, losses: Sequence[torch.Tensor], grad_norms: Sequence[torch.Tensor]) -> None:
    """Raise NonFiniteStep naming `step` and the values if the step's summed loss or its gradient norm is not
    finite."""
    loss = torch.stack(list(losses)).sum().float()
    values = torch.stack([loss, *(norm.detach().float().to(loss.device) for norm in grad_norms)])
    if bool(torch.isfinite(values).all()):
        return
    loss_value, *norms = values.tolist()
    raise NonFiniteStep(
        f"step {step}: loss={loss_value:g}, grad_norm={', '.join(f'{n:g}' for n in norms)} is not finite; stopped "
        f"before saving step {step}, so the latest checkpoint is the last good one (a lower optimizer.lr or "
        "training.max_norm may avoid it)"
    )
