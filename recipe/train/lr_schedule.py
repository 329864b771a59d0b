"""The learning-rate schedule: torchtitan's warm-up / stable / decay schedule, plus an optional re-warm.

A re-warm (`[lr_scheduler] rewarm_at_step`, `rewarm_steps`) restarts the warm-up at a step, typically the
switch from Lighthouse to dense attention: from that step the multiplier rises linearly from the schedule's
value there to the peak over `rewarm_steps` steps, then decays to `min_lr_factor` at the schedule's last step
with the configured `decay_type` (a `decay_ratio` plateau is not repeated). The multiplier is a pure function
of the step, so a resumed run follows the same schedule bit for bit.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

from torchtitan.components.lr_scheduler import LRSchedulersContainer, build_lr_schedulers as build_schedule
from torchtitan.components.optimizer import OptimizersContainer


def total_steps(lr_scheduler, training_steps: int) -> int:
    """The schedule's length: `[lr_scheduler] total_steps` if set, else `training.steps` (as torchtitan)."""
    return lr_scheduler.total_steps if lr_scheduler.total_steps is not None else training_steps


def rewarmed_multiplier(step: int, base: Callable[[int], float], at: int, steps: int, total: int, decay_type: str,
                        min_lr_factor: float) -> float:
    """The multiplier `base` (of the 0-based scheduler step) with a re-warm over `steps` steps from step `at`
    (the multiplier of training step `at + 1` is the first to change), decaying to `min_lr_factor` at `total`."""
    if step < at:
        return base(step)
    start = base(at)
    decay_from = at + steps
    if step < decay_from:
        return start + (1.0 - start) * (step + 1 - at) / steps
    progress = min(1.0, (step + 1 - decay_from) / (total + 1 - decay_from))
    if decay_type == "linear":
        shape = 1.0 - progress
    elif decay_type == "sqrt":
        shape = 1.0 - math.sqrt(progress)
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_factor + (1.0 - min_lr_factor) * shape


def build_lr_schedulers(optimizers: OptimizersContainer, lr_scheduler_config,
                        training_steps: int) -> LRSchedulersContainer:
    """torchtitan's schedulers, each multiplier re-warmed when `rewarm_steps` > 0 (the TrainSpec's builder)."""
    container = build_schedule(optimizers, lr_scheduler_config, training_steps)
    steps = getattr(lr_scheduler_config, "rewarm_steps", 0)
    if steps > 0:
        total = total_steps(lr_scheduler_config, training_steps)
        for scheduler in container:
            # a partial, as torchtitan's own multiplier: LambdaLR saves a partial's (empty) attributes and
            # a plain function as None, so only a partial keeps the checkpoint layout of a run without re-warm
            scheduler.lr_lambdas = [
                functools.partial(rewarmed_multiplier, base=base, at=lr_scheduler_config.rewarm_at_step, steps=steps,
                                  total=total, decay_type=lr_scheduler_config.decay_type,
                                  min_lr_factor=lr_scheduler_config.min_lr_factor)
                for base in scheduler.lr_lambdas]
    return container


def check_rewarm(job_config) -> None:
    """Raise ValueError naming the values if the re-warm settings cannot describe a re-warm of this run."""
    schedule = job_config.lr_scheduler
    at, steps = schedule.rewarm_at_step, schedule.rewarm_steps
    if at < 0 or steps < 0:
        raise ValueError(f"lr_scheduler.rewarm_at_step={at} and lr_scheduler.rewarm_steps={steps} must be >= 0")
    if steps == 0:
        if at:
            raise ValueError(f"lr_scheduler.rewarm_at_step={at} needs lr_scheduler.rewarm_steps > 0 (the steps of the "
                             "re-warm); set rewarm_at_step = 0 for no re-warm")
        return
    total = total_steps(schedule, job_config.training.steps)
    if not 1 <= at or at + steps >= total:
        raise ValueError(f"lr_scheduler.rewarm_at_step={at} with rewarm_steps={steps} must start at step >= 1 and "
                         f"end before the schedule's last step {total}")
