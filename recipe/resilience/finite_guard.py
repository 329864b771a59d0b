"""Stop a run whose loss or gradient norm is not finite, before a checkpoint of the bad step (or any later one)
is saved, naming the first bad step.

torchtitan's `Trainer.train_step` computes both and logs them on log steps only; a NaN step would still be
saved by the checkpoint that follows it, and every later step would train on NaN. The trainer collects each
step's losses (from `forward_backward_step`) and its gradient norm (`recorded_grad_norms`, around the step)
into a `FiniteGuard`, which keeps the first non-finite step on the device (no host sync), and calls `check`
(one device-to-host copy) on the steps that torchtitan logs or checkpoints and on the last one, so the
latest checkpoint stays the last good one and the host never waits for the device on the other steps. The
gradient norm is the same on every rank, so every rank stops at the same step.

A finite loss and gradient norm do not make a finite update (a NaN learning rate, an overflow in the optimizer
state), so before each save the trainer also checks what the checkpoint would hold (`non_finite_state`: the
parameters, the optimizer state and the learning rates), and nothing non-finite is ever saved.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torchtitan.distributed import utils as dist_utils

from recipe.errors import RunStopped
from recipe.resilience.checkpoint_guard import complete_steps


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


class FiniteGuard:
    """The first step whose summed loss or gradient norm was not finite, and those values, kept on the device."""

    def __init__(self) -> None:
        self.first_bad: torch.Tensor | None = None  # 0 while every step was finite
        self.bad_values: torch.Tensor | None = None

    def record(self, step: int, losses: Sequence[torch.Tensor], grad_norms: Sequence[torch.Tensor]) -> None:
        """Note one step's microbatch losses and gradient norm(s); device work only."""
        loss = torch.stack(list(losses)).sum().float()
        values = torch.stack([loss, *(norm.detach().float().to(loss.device) for norm in grad_norms)])
        if self.first_bad is None:
            self.first_bad = torch.zeros((), dtype=torch.int64, device=values.device)
            self.bad_values = torch.zeros_like(values)
        first = (self.first_bad == 0) & ~torch.isfinite(values).all()
        self.first_bad = torch.where(first, step, self.first_bad)
        self.bad_values = torch.where(first, values, self.bad_values)

    def check(self, step: int, folder: str = "") -> None:
        """Raise NonFiniteStep naming the first bad step and its values if there was one (waits for the device),
        and the newest checkpoint in `folder`, which a restart resumes from."""
        if self.first_bad is None or not (bad := int(self.first_bad)):
            return
        loss, *norms = self.bad_values.tolist()
        raise NonFiniteStep(
            f"step {bad}: loss={loss:g}, grad_norm={', '.join(f'{n:g}' for n in norms)} is not finite; stopped at "
            f"step {step} before saving it, so {last_good(folder)} (a lower optimizer.lr or training.max_norm may "
            "avoid it)"
        )


def last_good(folder: str) -> str:
    """What a restart after a stop of the finite guard resumes from: the newest checkpoint in `folder`."""
    steps = complete_steps(folder)
    if not steps:
        return "no checkpoint was saved (a restart starts over)"
    return f"the latest checkpoint is the last good one (step-{steps[0]})"


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def non_finite_state(model_parts: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer],
                     lrs: Iterable[float]) -> str | None:
    """The first parameter, optimizer state entry or learning rate that is NaN or infinite, named; None if every
    one is finite. One device-to-host copy; every rank of a job gets the same answer (the flags are all-reduced,
    as each rank holds only its shards)."""
    for i, lr in enumerate(lrs):
        if not math.isfinite(lr):
            return f"the learning rate of parameter group {i} (lr={lr:g})"
    names = {id(p): name for part in model_parts for name, p in part.named_parameters()}
    entries = [(f"parameter {name}", p) for part in model_parts for name, p in part.named_parameters()]
    entries += [(f"optimizer state {key} of {names.get(id(p), 'a parameter')}", value)
                for optimizer in optimizers for p, state in optimizer.state.items() for key, value in state.items()
                if isinstance(value, torch.Tensor) and value.is_floating_point()]
    device = _local(entries[0][1]).device if entries else torch.device("cpu")
    flags = torch.stack([(~torch.isfinite(_local(t).detach())).any().to(device) for _, t in entries]
                        or [torch.zeros((), dtype=torch.bool, device=device)])
    anywhere = flags.any().to(torch.int32)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:  # ranks hold different shards
        dist.all_reduce(anywhere, op=dist.ReduceOp.MAX)
    if not anywhere.item():
        return None
    bad = flags.nonzero().flatten().tolist()
    return entries[bad[0]][0] if bad else "a parameter or optimizer state entry of another rank"


def checkpoint_due(job_config, step: int) -> bool:
    """Whether torchtitan's checkpointer saves at `step` (its interval, the last step, and the optional first)."""
    checkpoint = job_config.checkpoint
    return checkpoint.enable and (step % checkpoint.interval == 0 or step == job_config.training.steps
                                  or (step == 1 and checkpoint.enable_first_step_checkpoint))
