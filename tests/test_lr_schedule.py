"""The learning-rate re-warm (`[lr_scheduler] rewarm_at_step`, `rewarm_steps`): torchtitan's schedule up to the
re-warm step, then a linear rise from the schedule's value there to the peak, then a decay to `min_lr_factor`
at the schedule's end; off by default; a mistake names the keys."""
import random
from types import SimpleNamespace

import pytest
import torch

import recipe  # noqa: F401  (before torchtitan)
from torchtitan.components.lr_scheduler import build_lr_schedulers as torchtitan_schedulers
from torchtitan.components.optimizer import OptimizersContainer

from recipe.train.lr_schedule import build_lr_schedulers, check_rewarm


def schedule(warmup=7, total=None, decay_type="linear", min_lr_factor=0.0, at=0, steps=0, decay_ratio=None):
    return SimpleNamespace(warmup_steps=warmup, total_steps=total, decay_ratio=decay_ratio, decay_type=decay_type,
                           min_lr_factor=min_lr_factor, rewarm_at_step=at, rewarm_steps=steps)


def lrs(config, training_steps: int, lr: float = 1e-3, builder=build_lr_schedulers) -> list[float]:
    """The learning rate of each training step 1..training_steps."""
    model = torch.nn.Linear(3, 2)
    optimizers = OptimizersContainer([model], torch.optim.AdamW, {"lr": lr})
    schedulers = builder(optimizers, config, training_steps)
    rates = []
    for _ in range(training_steps):
        rates.append(optimizers.optimizers[0].param_groups[0]["lr"])
        schedulers.step()
    return rates


@pytest.mark.parametrize("decay_type", ["linear", "sqrt", "cosine"])
def test_without_a_rewarm_the_schedule_is_torchtitans_own(decay_type):
    steps = random.randint(20, 60)
    config = schedule(warmup=random.randint(1, 9), decay_type=decay_type, min_lr_factor=random.random() * 0.3)
    assert lrs(config, steps) == lrs(config, steps, builder=torchtitan_schedulers)


@pytest.mark.parametrize("decay_type", ["linear", "cosine"])
def test_a_rewarm_rises_from_the_schedules_value_to_the_peak_then_decays_to_the_floor_at_the_end(decay_type):
    total, at, steps, floor = 100, random.randint(20, 60), random.randint(3, 12), 0.1
    plain = lrs(schedule(decay_type=decay_type, min_lr_factor=floor), total)
    rewarmed = lrs(schedule(decay_type=decay_type, min_lr_factor=floor, at=at, steps=steps), total)
    assert rewarmed[:at] == plain[:at]                      # training steps 1..at untouched
    rise = rewarmed[at:at + steps]                         # training steps at+1 .. at+steps
    assert all(b > a for a, b in zip([plain[at]] + rise, rise)), "the re-warm rises at every step"
    assert rise[-1] == pytest.approx(1e-3)                 # the peak, reached at the re-warm's last step
    expected = [plain[at] + (1e-3 - plain[at]) * i / steps for i in range(1, steps + 1)]
    assert rise == pytest.approx(expected, rel=1e-12)
    decay = rewarmed[at + steps - 1:]
    assert all(b < a for a, b in zip(decay, decay[1:])), "then it decays at every step"
    gap = decay[-1] - 1e-3 * floor                         # the last training step is one step short of the end
    assert 0 < gap <= (decay[-2] - decay[-1]) * (1 + 1e-9), "it ends within its last step's decrease above the floor"


def test_a_resumed_scheduler_continues_the_rewarm_exactly():
    config, total = schedule(at=30, steps=10), 60
    model = torch.nn.Linear(3, 2)
    whole = lrs(config, total)
    optimizers = OptimizersContainer([model], torch.optim.AdamW, {"lr": 1e-3})
    first = build_lr_schedulers(optimizers, config, total)
    cut = random.randint(25, 45)
    for _ in range(cut):
        first.step()
    state = first.state_dict()
    optimizers = OptimizersContainer([model], torch.optim.AdamW, {"lr": 1e-3})
    resumed = build_lr_schedulers(optimizers, config, total)
    resumed.load_state_dict(state)
    rates = []
    for _ in range(total - cut):
        rates.append(resumed.schedulers[0].get_last_lr()[0])
        resumed.step()
    assert rates == whole[cut:]


@pytest.mark.parametrize("at, steps, message", [
    (-1, 5, r"lr_scheduler.rewarm_at_step=-1 and lr_scheduler.rewarm_steps=5 must be >= 0"),
    (5, -2, r"lr_scheduler.rewarm_at_step=5 and lr_scheduler.rewarm_steps=-2 must be >= 0"),
    (40, 0, r"lr_scheduler.rewarm_at_step=40 needs lr_scheduler.rewarm_steps > 0"),
    (0, 10, r"lr_scheduler.rewarm_at_step=0 with rewarm_steps=10 must start at step >= 1"),
    (95, 5, r"lr_scheduler.rewarm_at_step=95 with rewarm_steps=5 .* before the schedule's last step 100"),
])
def test_rewarm_settings_that_describe_no_rewarm_are_named(at, steps, message):
    job = SimpleNamespace(lr_scheduler=schedule(at=at, steps=steps), training=SimpleNamespace(steps=100))
    with pytest.raises(ValueError, match=message):
        check_rewarm(job)


def test_the_rewarm_keys_are_toml_and_command_line_options_checked_at_start_up(tmp_path):
    from recipe.train.trainer import check_job
    from torchtitan.config import ConfigManager

    job = ConfigManager().parse_args(["--job.config_file", "configs/debug.toml", "--lr_scheduler.rewarm_at_step",
                                      "10", "--lr_scheduler.rewarm_steps", "4"])
    assert (job.lr_scheduler.rewarm_at_step, job.lr_scheduler.rewarm_steps) == (10, 4)
    check_job(job)
    job.lr_scheduler.rewarm_steps = 0
    with pytest.raises(ValueError, match="rewarm_at_step=10 needs"):
        check_job(job)


def test_a_rewarmed_scheduler_saves_the_layout_of_torchtitans_so_a_stage_1_checkpoint_loads_into_it():
    config, model = schedule(at=30, steps=10), torch.nn.Linear(3, 2)
    optimizers = OptimizersContainer([model], torch.optim.AdamW, {"lr": 1e-3})
    plain = torchtitan_schedulers(optimizers, schedule(), 60).state_dict()
    rewarmed = build_lr_schedulers(optimizers, config, 60).state_dict()
    assert rewarmed.keys() == plain.keys() and rewarmed["lr_lambdas"] == plain["lr_lambdas"]
