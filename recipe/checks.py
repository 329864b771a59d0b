"""Start-up checks of the settings torchtitan reads and of the dump folder, before anything is built or
written: each raises ValueError naming the key and its value, so a job that cannot mean what it says stops
with one line instead of training wrongly (a negative `max_norm` ascends the gradient) or dying deep inside
torchtitan later (a zero `log_freq` divides by zero at the first step).

`check_settings` (the values alone) runs in `recipe.trainer.check_job`, after the `[lighthouse]` checks of
`recipe.job_config.check_job_config`; `check_environment` (the values against this machine, the data and the
dump folder) runs when the trainer starts, before it writes anything.
"""
from __future__ import annotations

import math
import os

import torch
from torchtitan.tools.logging import logger

from .checkpoint_guard import complete_steps
from .data import check_training_data, match_local_files
from .lr_schedule import check_rewarm
from .run_record import CONFIG_FILE, RUNS_FOLDER
from .toml_config import get_key, load_toml, tomllib

# Inner attention kernels and pipelines that run on CUDA only (the CPU has math and flash SDPA, and the
# fused Triton kernels only in Triton's interpreter).
CUDA_BACKENDS = ("cudnn", "efficient", "flash_attn")


def _positive_finite(key: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{key}={value} must be a finite number > 0")


def check_optimizer(job_config) -> None:
    """`[optimizer]`, `training.max_norm` and `[lr_scheduler]` values an AdamW run can mean."""
    optimizer = job_config.optimizer
    if not (math.isfinite(optimizer.lr) and optimizer.lr >= 0):  # 0 freezes the weights (evaluation runs)
        raise ValueError(f"optimizer.lr={optimizer.lr} must be a finite number >= 0")
    _positive_finite("optimizer.eps", optimizer.eps)
    if not (math.isfinite(optimizer.weight_decay) and optimizer.weight_decay >= 0):
        raise ValueError(f"optimizer.weight_decay={optimizer.weight_decay} must be a finite number >= 0")
    for key in ("beta1", "beta2"):
        beta = getattr(optimizer, key)
        if not 0 <= beta < 1:
            raise ValueError(f"optimizer.{key}={beta} must be in [0, 1)")
    if not (math.isfinite(job_config.training.max_norm) and job_config.training.max_norm > 0):
        raise ValueError(f"training.max_norm={job_config.training.max_norm} must be a finite number > 0: it is the "
                         "gradient clipping threshold (a negative one ascends the gradient, 0 stops learning)")
    if job_config.lr_scheduler.warmup_steps < 0:
        raise ValueError(f"lr_scheduler.warmup_steps={job_config.lr_scheduler.warmup_steps} must be >= 0")


def check_loop(job_config) -> None:
    """Batch sizes, checkpoint and log intervals, and the step of the switch to dense attention."""
    training = job_config.training
    if training.local_batch_size < 1:
        raise ValueError(f"training.local_batch_size={training.local_batch_size} must be >= 1")
    if job_config.checkpoint.enable and job_config.checkpoint.interval < 1:
        raise ValueError(f"checkpoint.interval={job_config.checkpoint.interval} must be >= 1")
    if job_config.metrics.log_freq < 1:
        raise ValueError(f"metrics.log_freq={job_config.metrics.log_freq} must be >= 1")
    switch = job_config.lighthouse.switch_to_dense_at_step
    if job_config.lighthouse.enable and 0 < switch and switch >= training.steps:
        raise ValueError(f"[lighthouse] switch_to_dense_at_step={switch} is not below training.steps="
                         f"{training.steps}: the run would never switch to dense attention")


def check_parallelism(job_config, world_size: int) -> None:
    """The parallel degrees multiply to `world_size`; the global batch is a multiple of the data-parallel one."""
    p = job_config.parallelism
    degrees = {"data_parallel_replicate_degree": p.data_parallel_replicate_degree,
               "context_parallel_degree": p.context_parallel_degree, "tensor_parallel_degree": p.tensor_parallel_degree,
               "pipeline_parallel_degree": p.pipeline_parallel_degree}
    for key, degree in [*degrees.items(), ("expert_parallel_degree", p.expert_parallel_degree)]:
        if degree < 1:
            raise ValueError(f"parallelism.{key}={degree} must be >= 1")
    others = math.prod(degrees.values())
    shard = p.data_parallel_shard_degree
    if shard == -1:
        shard = world_size // others
    if shard < 1 or shard * others != world_size:
        named = " * ".join(f"{key}={value}" for key, value in
                           [("data_parallel_shard_degree", p.data_parallel_shard_degree), *degrees.items()])
        raise ValueError(f"parallelism: {named} does not make the {world_size} processes of this job "
                         "(WORLD_SIZE); data_parallel_shard_degree = -1 takes the rest")
    batch_degree = p.data_parallel_replicate_degree * shard
    training = job_config.training
    per_step = training.local_batch_size * batch_degree
    if training.global_batch_size == 0:
        raise ValueError("training.global_batch_size=0 must be > 0, or -1 for local_batch_size times the "
                         "data-parallel degree")
    if training.global_batch_size > 0 and training.global_batch_size % per_step:
        raise ValueError(f"training.global_batch_size={training.global_batch_size} is not a multiple of "
                         f"training.local_batch_size={training.local_batch_size} times the data-parallel degree "
                         f"{batch_degree} (= {per_step})")


def check_device(job_config) -> None:
    """Lighthouse kernels that need CUDA are not asked for on a machine without it."""
    if torch.cuda.is_available():
        return
    section = job_config.lighthouse
    if section.enable and section.backend in CUDA_BACKENDS:
        raise ValueError(f"[lighthouse] backend={section.backend!r} needs CUDA, which this machine lacks; use 'auto'")
    if section.enable and section.implementation == "fused" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("[lighthouse] implementation='fused' needs CUDA (or TRITON_INTERPRET=1), which this "
                         "machine lacks; use 'auto'")


def latest_checkpoint_step(job_config) -> int | None:
    """The step of the newest complete checkpoint in the job's checkpoint folder."""
    return max(complete_steps(os.path.join(job_config.job.dump_folder, job_config.checkpoint.folder)), default=None)


def check_dump_folder(job_config) -> None:
    """The dump folder and checkpoint folder are folders, and a resume has steps left to train."""
    dump = job_config.job.dump_folder
    if not dump:
        raise ValueError('job.dump_folder="" names no folder (checkpoints would land in the working directory)')
    if os.path.exists(dump) and not os.path.isdir(dump):
        raise ValueError(f"job.dump_folder={dump!r} is a file, not a folder")
    checkpoint = job_config.checkpoint
    if not checkpoint.enable:
        return
    folder = os.path.join(dump, checkpoint.folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"checkpoint.folder={checkpoint.folder!r}: {folder} is a file, not a folder")
    latest = latest_checkpoint_step(job_config)
    if checkpoint.load_step == -1 and latest is not None and latest > job_config.training.steps:
        raise ValueError(f"training.steps={job_config.training.steps} is below step {latest} of the latest "
                         f"checkpoint in {folder}: raise training.steps, or pass another --job.dump_folder")


def previous_run_config(job_config) -> dict | None:
    """The settings of the latest earlier start of this job (`<dump_folder>/runs/*/config.toml`), if readable."""
    runs = os.path.join(job_config.job.dump_folder, RUNS_FOLDER)
    records = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
    try:
        return load_toml(os.path.join(runs, records[-1], CONFIG_FILE)) if records else None
    except (OSError, tomllib.TOMLDecodeError):
        return None


def check_resume(job_config) -> None:
    """A resume from the job's own checkpoint keeps the model flavor and dataset of the run that wrote it (else
    the load fails with a page of size mismatches, or the data position belongs to another source), and is
    warned when it sets another `optimizer.lr`: the checkpoint's LR scheduler restores the old base LR."""
    if not job_config.checkpoint.enable or latest_checkpoint_step(job_config) is None:
        return
    before = previous_run_config(job_config)
    if before is None:
        return
    folder = os.path.join(job_config.job.dump_folder, job_config.checkpoint.folder)
    for key, now in (("model.flavor", job_config.model.flavor), ("training.dataset", job_config.training.dataset)):
        then = get_key(before, key)
        if then is not None and then != now:
            raise ValueError(f"{key}={now!r} differs from {then!r} of the run that wrote the checkpoints in {folder}; "
                             "resume with the same value, or pass another --job.dump_folder")
    lr = get_key(before, "optimizer.lr")
    if lr is not None and lr != job_config.optimizer.lr:
        logger.warning(f"optimizer.lr={job_config.optimizer.lr} differs from {lr} of the run that wrote the "
                       f"checkpoint: the resumed LR schedule keeps {lr}; to change it, start another "
                       "job.dump_folder with checkpoint.initial_load_path")


def check_dense_layers_leave_lighthouse(job_config, n_layers: int) -> None:
    """With Lighthouse enabled, `dense_layers` leaves at least one layer to run it."""
    section = job_config.lighthouse
    if section.enable and n_layers and set(section.dense_layers) >= set(range(n_layers)):
        raise ValueError(f"[lighthouse] dense_layers={list(section.dense_layers)} covers all {n_layers} layers "
                         "with enable=true: no layer runs Lighthouse; set enable = false for a dense run")


def check_validation_data(job_config) -> None:
    """`validation.dataset = "local"` files exist and hold bytes (the held-out windows are read at each evaluation)."""
    validation = job_config.validation
    if validation.enable and validation.dataset == "local":
        match_local_files(validation.dataset_path, "validation.dataset_path")


def check_settings(job_config, n_layers: int) -> None:
    """The checks of the settings alone (nothing on disk, no device), for a model of `n_layers` layers."""
    check_optimizer(job_config)
    check_rewarm(job_config)
    check_loop(job_config)
    check_dense_layers_leave_lighthouse(job_config, n_layers)


def check_environment(job_config) -> None:
    """The checks of the settings against this machine and job: the processes (WORLD_SIZE, which torchrun and
    train.py set and torchtitan reads), CUDA, the data, the dump folder and the checkpoint a resume loads."""
    check_parallelism(job_config, int(os.environ.get("WORLD_SIZE", "1")))
    check_device(job_config)
    check_training_data(job_config)
    check_validation_data(job_config)
    check_dump_folder(job_config)
    check_resume(job_config)
