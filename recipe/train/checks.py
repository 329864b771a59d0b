"""Start-up checks of the settings torchtitan reads and of the dump folder, before anything is built or
written: each raises ValueError naming the key and its value, so a job that cannot mean what it says stops
with one line instead of training wrongly (a negative `max_norm` ascends the gradient) or dying deep inside
torchtitan later (a zero `log_freq` divides by zero at the first step).

`check_settings` (the values alone) runs in `recipe.train.trainer.check_job`, after the `[lighthouse]` checks of
`recipe.train.job_config.check_job_config`; `check_environment` (the values against this machine, the data and the
dump folder) runs when the trainer starts, before it writes anything.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import netrc
import os
import urllib.parse
from typing import Iterator, Mapping

import torch
from torchtitan.tools.logging import logger

from lighthouse.attention import CUDA_ONLY

from recipe.data.loader import check_path_is_read, check_training_data, match_local_files, warn_small_corpus
from recipe.data.tokenizer import tokenizer_setting
from recipe.errors import file_in_the_way
from recipe.logs.run_record import CONFIG_FILE, RUNS_FOLDER, recorded_tokenizer
from recipe.resilience.checkpoint_guard import complete_steps, resume_step
from recipe.resilience.checkpoint_manifest import UnreadableManifest, read_manifest
from recipe.toml_config import get_key, load_toml, tomllib
from recipe.train.cpu_size import cpu_size_error
from recipe.train.lr_schedule import check_rewarm



def _positive_finite(key: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{key}={value} must be a finite number > 0")


OPTIMIZERS = ("Adam", "AdamW")  # what torchtitan's build_optimizers knows
# Values a run accepts but that almost certainly say something else than meant: each is warned once.
TINY_LR, TINY_MAX_NORM, HUGE_EPS = 1e-12, 1e-12, 1.0


def float_settings(config, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every float setting of a job config (dataclasses, nested), lists included, with its dotted key."""
    for field in dataclasses.fields(config):
        value, key = getattr(config, field.name), f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            yield from float_settings(value, f"{key}.")
        elif isinstance(value, float):
            yield key, value
        elif isinstance(value, (list, tuple)):
            yield from ((f"{key}[{i}]", item) for i, item in enumerate(value) if isinstance(item, float))


def check_no_nan(job_config) -> None:
    """No setting is NaN: every one would train on NaN or fail deep inside torchtitan."""
    for key, value in float_settings(job_config):
        if math.isnan(value):
            raise ValueError(f"{key}=nan is not a number; set a number (train.py --help gives the default)")


def check_lr_schedule(job_config) -> None:
    """`min_lr_factor` in [0, 1] (outside it the LR rises during decay or goes negative), a `total_steps` that
    is unset or covers `training.steps`, and a `decay_ratio` that is unset or in [0, 1]."""
    schedule = job_config.lr_scheduler
    if not 0 <= schedule.min_lr_factor <= 1:
        raise ValueError(f"lr_scheduler.min_lr_factor={schedule.min_lr_factor} must be in [0, 1]: the LR decays to "
                         "optimizer.lr times this factor (above 1 it rises during the decay, below 0 it ascends "
                         "the gradient)")
    steps = job_config.training.steps
    if schedule.total_steps is not None and schedule.total_steps < steps:
        raise ValueError(f"lr_scheduler.total_steps={schedule.total_steps} is below training.steps={steps}: the "
                         "schedule would end before the run (past its end the LR decays below min_lr_factor or the "
                         "decay divides by zero); set it >= training.steps, or leave it unset")
    if schedule.decay_ratio is not None and not 0 <= schedule.decay_ratio <= 1:
        raise ValueError(f"lr_scheduler.decay_ratio={schedule.decay_ratio} must be in [0, 1]: the share of "
                         "training.steps spent decaying (leave it unset to decay after the warmup)")


def warn_accepted_nonsense(job_config) -> None:
    """One warning line for values a run accepts that leave the weights (all but) frozen."""
    lr, max_norm, eps = job_config.optimizer.lr, job_config.training.max_norm, job_config.optimizer.eps
    if lr == 0:
        logger.warning("optimizer.lr=0 freezes the weights: every step computes the loss and leaves the model as it "
                       "was; set a usual LR (1e-4 to 1e-3) to train")
    if 0 < lr < TINY_LR:
        logger.warning(f"optimizer.lr={lr:g} is so small that no float32 weight moves; set 0 to freeze the weights "
                       "on purpose, or a usual LR (1e-4 to 1e-3)")
    if max_norm < TINY_MAX_NORM:
        logger.warning(f"training.max_norm={max_norm:g} clips every gradient to almost nothing: the weights all but "
                       "stop moving (the usual value is 1.0)")
    if eps > HUGE_EPS:
        logger.warning(f"optimizer.eps={eps:g} dwarfs every gradient's second moment: the updates are all but zero "
                       "(the usual value is 1e-8)")


def check_optimizer(job_config) -> None:
    """`[optimizer]`, `training.max_norm` and `[lr_scheduler]` values an AdamW run can mean."""
    optimizer = job_config.optimizer
    if optimizer.name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name={optimizer.name!r} is not one of {OPTIMIZERS}")
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
    check_lr_schedule(job_config)
    warn_accepted_nonsense(job_config)
    grace = job_config.resilience.sigterm_grace_s
    if not (math.isfinite(grace) and grace >= 0):
        raise ValueError(f"[resilience] sigterm_grace_s={grace} must be a finite number >= 0")


SEED_RANGE = (-2**63, 2**64)  # what torch.manual_seed takes
STEP_BITS = 63  # a step count torch holds in an int64


def check_seed(job_config) -> None:
    """`debug.seed` fits the 64 bits torch's generators take."""
    seed = job_config.debug.seed
    if seed is not None and not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise ValueError(f"debug.seed={seed} does not fit in 64 bits: torch takes seeds in [-2**63, 2**64)")


def check_loop(job_config) -> None:
    """Batch sizes, checkpoint and log intervals, and the step of the switch to dense attention."""
    training = job_config.training
    if training.steps.bit_length() > STEP_BITS:
        raise ValueError(f"training.steps={training.steps} does not fit in 64 bits: torch counts steps in int64 (the "
                         "LR scheduler, the metrics)")
    if training.local_batch_size < 1:
        raise ValueError(f"training.local_batch_size={training.local_batch_size} must be >= 1")
    if job_config.checkpoint.enable and job_config.checkpoint.interval < 1:
        raise ValueError(f"checkpoint.interval={job_config.checkpoint.interval} must be >= 1")
    if job_config.metrics.log_freq < 1:
        raise ValueError(f"metrics.log_freq={job_config.metrics.log_freq} must be >= 1")
    if training.gc_freq < 1:
        raise ValueError(f"training.gc_freq={training.gc_freq} must be >= 1 (steps between garbage collections)")
    if (job_config.checkpoint.enable and not job_config.resilience.checksums
            and not job_config.checkpoint.load_unverified):
        raise ValueError("[resilience] checksums=false with checkpoint.enable: the steps this job saves record no "
                         "checksums, so a resume cannot verify them and takes none; pass --checkpoint.load_unverified "
                         "too to resume them unverified, or leave checksums on")
    keep = job_config.checkpoint.keep_latest_k
    if job_config.checkpoint.enable and (keep < 0 or keep == 1):
        raise ValueError(f"checkpoint.keep_latest_k={keep} must be 0 (keep every checkpoint) or >= 2 (the newest "
                         "may be in the middle of its save when the older ones are purged)")
    switch, every = job_config.lighthouse.switch_to_dense_at_step, job_config.lighthouse.dense_every
    if job_config.lighthouse.enable and 0 < switch and switch >= training.steps:
        raise ValueError(f"[lighthouse] switch_to_dense_at_step={switch} is not below training.steps="
                         f"{training.steps}: the run would never switch to dense attention")
    last = switch if switch > 0 else training.steps  # the last Lighthouse step, where dense_every applies
    if job_config.lighthouse.enable and every > last:
        raise ValueError(f"[lighthouse] dense_every={every} is above the run's last Lighthouse step {last} "
                         f"(training.steps={training.steps}, switch_to_dense_at_step={switch}): no step would be "
                         "dense; lower it, or leave it at 0 for none")


def check_checkpoint_loads(job_config) -> None:
    """A checkpoint to load is asked for only with `checkpoint.enable`: torchtitan loads through its checkpointer
    alone, so with it off the run would start from fresh weights without a word."""
    checkpoint = job_config.checkpoint
    if checkpoint.enable:
        return
    if checkpoint.initial_load_path:
        raise ValueError(f"checkpoint.initial_load_path={checkpoint.initial_load_path!r} with checkpoint.enable = "
                         "false: torchtitan loads it only through the checkpointer, so the run would start from "
                         "fresh weights; pass --checkpoint.enable, or unset initial_load_path")
    if checkpoint.load_step != -1:
        raise ValueError(f"checkpoint.load_step={checkpoint.load_step} with checkpoint.enable = false: no checkpoint "
                         "is loaded, so the run would start from step 0; pass --checkpoint.enable, or leave "
                         "load_step at -1")


AC_MODES = ("none", "full", "selective", "memory_budget")  # what torchtitan's apply_ac and its callers know


def check_activation_checkpoint(job_config) -> None:
    """`[activation_checkpoint]` values torchtitan can apply (it would raise from inside model building)."""
    ac, compile_ = job_config.activation_checkpoint, job_config.compile
    if ac.mode not in AC_MODES:
        raise ValueError(f"activation_checkpoint.mode={ac.mode!r} is not one of {AC_MODES}")
    option = ac.selective_ac_option
    if ac.mode == "selective" and not (option == "op" or (option.isascii() and option.isdigit())):
        raise ValueError(f"activation_checkpoint.selective_ac_option={option!r} must be 'op' (per operator) or a "
                         "whole number n >= 0 (every n-th block; 0 every block)")
    if ac.mode == "memory_budget":
        if not (compile_.enable and "model" in compile_.components):
            raise ValueError("activation_checkpoint.mode='memory_budget' needs the model compiled (the compiler's "
                             "partitioner applies the budget): set compile.enable with 'model' in compile.components, "
                             "or use mode 'full' or 'selective'")
        if not 0 <= ac.memory_budget <= 1:
            raise ValueError(f"activation_checkpoint.memory_budget={ac.memory_budget} must be in [0, 1]")


def _shard_degree(job_config, world_size: int) -> int:
    """`data_parallel_shard_degree`, with -1 resolved to what the other degrees leave of `world_size`."""
    p = job_config.parallelism
    if p.data_parallel_shard_degree != -1:
        return p.data_parallel_shard_degree
    return world_size // (p.data_parallel_replicate_degree * p.context_parallel_degree * p.tensor_parallel_degree
                          * p.pipeline_parallel_degree)


def data_parallel_degree(job_config, world_size: int) -> int:
    """How many data-parallel ranks (replicate times shard) a job of `world_size` processes has: each reads its
    own share of the data and keeps its own data position in a checkpoint."""
    return job_config.parallelism.data_parallel_replicate_degree * _shard_degree(job_config, world_size)


def check_launch(job_config, environ: Mapping[str, str]) -> None:
    """`RANK` and `WORLD_SIZE` make sense, and a job of several processes has a rendezvous (torchrun's, or
    `MASTER_ADDR` of a launcher that sets it): without one, rank 0 waits for the others forever."""
    rank, world = environ.get("RANK", "0"), environ.get("WORLD_SIZE", "1")
    if not (rank.isdigit() and world.isdigit() and int(rank) < int(world)):
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world} in the environment: RANK must be in [0, WORLD_SIZE); "
                         "unset both for a one-process job, or start the job with torchrun")
    rendezvous = "TORCHELASTIC_RUN_ID" in environ or bool(environ.get("MASTER_ADDR"))
    if int(world) > 1 and not rendezvous and job_config.comm.mode == "default":
        raise ValueError(f"WORLD_SIZE={world} in the environment, but the job was not started by torchrun (no "
                         "TORCHELASTIC_RUN_ID or MASTER_ADDR), so rank 0 would wait for the others forever: start "
                         f"it with torchrun --nproc_per_node={world}, or unset RANK and WORLD_SIZE")


def device_memory_bytes() -> int:
    """The memory of the device a job trains on: the first GPU's, else this machine's RAM."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_size(job_config, dim: int) -> None:
    """A microbatch that fits: one float32 hidden state of it (a lower bound of what a step holds) fits in the
    device's memory, and on a CPU it is one a CPU trains in minutes a step (`recipe.train.cpu_size.cpu_size_error`)."""
    training = job_config.training
    tokens = training.local_batch_size * training.seq_len
    size = f"training.local_batch_size={training.local_batch_size} x training.seq_len={training.seq_len}"
    memory = device_memory_bytes()
    if tokens * dim * 4 > memory:
        raise ValueError(f"{size} = {tokens:,} tokens per microbatch: one float32 hidden state of it ({dim} values a "
                         f"token) needs {tokens * dim * 4 / 2**30:,.0f} GiB, more than the device's "
                         f"{memory / 2**30:,.0f} GiB; lower them (training.global_batch_size accumulates microbatches)")
    if not torch.cuda.is_available() and job_config.comm.mode == "default" and (  # not a dry run: it trains
            error := cpu_size_error(job_config.model.flavor, training.local_batch_size, training.seq_len)):
        raise ValueError(error)


def check_parallelism(job_config, world_size: int) -> None:
    """The parallel degrees multiply to `world_size`; the global batch is a multiple of the data-parallel one."""
    p = job_config.parallelism
    degrees = {"data_parallel_replicate_degree": p.data_parallel_replicate_degree,
               "context_parallel_degree": p.context_parallel_degree, "tensor_parallel_degree": p.tensor_parallel_degree,
               "pipeline_parallel_degree": p.pipeline_parallel_degree}
    for key, degree in [*degrees.items(), ("expert_parallel_degree", p.expert_parallel_degree)]:
        if degree < 1:
            raise ValueError(f"parallelism.{key}={degree} must be >= 1")
    if p.expert_parallel_degree != 1:
        raise ValueError(f"parallelism.expert_parallel_degree={p.expert_parallel_degree}: the recipe's models have "
                         "no experts; leave it at 1")
    others = math.prod(degrees.values())
    shard = _shard_degree(job_config, world_size)
    if shard < 1 or shard * others != world_size:
        named = " * ".join(f"{key}={value}" for key, value in
                           [("data_parallel_shard_degree", p.data_parallel_shard_degree), *degrees.items()])
        raise ValueError(f"parallelism: {named} does not make the {world_size} processes of this job "
                         "(WORLD_SIZE); data_parallel_shard_degree = -1 takes the rest")
    batch_degree = data_parallel_degree(job_config, world_size)
    training = job_config.training
    per_step = training.local_batch_size * batch_degree
    if training.global_batch_size == 0 or training.global_batch_size < -1:
        raise ValueError(f"training.global_batch_size={training.global_batch_size} must be > 0, or -1 for "
                         "local_batch_size times the data-parallel degree")
    if training.global_batch_size > 0 and training.global_batch_size % per_step:
        raise ValueError(f"training.global_batch_size={training.global_batch_size} is not a multiple of "
                         f"training.local_batch_size={training.local_batch_size} times the data-parallel degree "
                         f"{batch_degree} (= {per_step})")


def check_compile(job_config) -> None:
    """`compile.backend` names a torch.compile backend (torch would raise InvalidBackend at the first compiled
    call, after the model is built); only asked when `compile.enable` compiles anything."""
    backend = job_config.compile.backend
    if not job_config.compile.enable:
        return
    known = torch.compiler.list_backends(exclude_tags=())
    if backend not in known:
        raise ValueError(f"compile.backend={backend!r} is not a torch.compile backend; the usual one is 'inductor' "
                         f"(torch knows {', '.join(known)})")


def check_device(job_config) -> None:
    """Lighthouse kernels that need CUDA are not asked for on a machine without it."""
    if torch.cuda.is_available():
        return
    section = job_config.lighthouse
    if section.enable and section.backend in CUDA_ONLY + ("flash_attn",):
        raise ValueError(f"[lighthouse] backend={section.backend!r} needs CUDA, which this machine lacks; use 'auto'")
    if section.dense_backend == "flash_attn":
        raise ValueError("[lighthouse] dense_backend='flash_attn' needs CUDA, which this machine lacks; use 'cudnn'")
    if section.enable and section.implementation == "fused" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("[lighthouse] implementation='fused' needs CUDA (or TRITON_INTERPRET=1), which this "
                         "machine lacks; use 'auto'")


def latest_checkpoint_step(job_config) -> int | None:
    """The step a resume of the job starts from: its newest complete checkpoint that is not damaged (its
    manifest lists every file at its size: `resume_step`); a damaged one is passed over, so it has no say."""
    folder = os.path.join(job_config.job.dump_folder, job_config.checkpoint.folder)
    return resume_step(folder, job_config.checkpoint.load_unverified)


def check_dump_folder(job_config) -> None:
    """The dump folder and checkpoint folder are folders or can be created as such, and a resume has steps
    left to train."""
    dump = job_config.job.dump_folder
    if not dump:
        raise ValueError('job.dump_folder="" names no folder (checkpoints would land in the working directory)')
    if (blocked := file_in_the_way(dump)) is not None:
        what = "is" if blocked == os.path.abspath(dump) else f"cannot be created: {blocked} is"
        raise ValueError(f"job.dump_folder={dump!r} {what} a file, not a folder")
    checkpoint = job_config.checkpoint
    if not checkpoint.enable:
        return
    folder = os.path.join(dump, checkpoint.folder)
    if os.path.normpath(folder) == os.path.normpath(dump):
        raise ValueError(f"checkpoint.folder={checkpoint.folder!r} is the dump folder itself: its step folders would "
                         "lie among the run records and metrics; name a sub-folder (the default is 'checkpoint')")
    if (blocked := file_in_the_way(folder)) is not None:
        what = "" if blocked == os.path.abspath(folder) else f" cannot be created: {blocked}"
        raise ValueError(f"checkpoint.folder={checkpoint.folder!r}: {folder}{what} is a file, not a folder")
    latest = latest_checkpoint_step(job_config)
    check_load_step(checkpoint.load_step, folder)
    if checkpoint.load_step == -1 and latest is not None and latest > job_config.training.steps:
        raise ValueError(f"training.steps={job_config.training.steps} is below step {latest} of the latest "
                         f"checkpoint in {folder}: raise training.steps, or pass another --job.dump_folder")


def check_load_step(step: int, folder: str) -> None:
    """`checkpoint.load_step` (unless -1, the latest) names a complete checkpoint of the job's own folder
    (torchtitan would ignore it in a fresh folder, or fail with a traceback on a missing step)."""
    if step == -1:
        return
    steps = complete_steps(folder)
    if not steps:
        raise ValueError(f"checkpoint.load_step={step}: {folder} holds no complete checkpoint to load it from; leave "
                         "load_step at -1 to start fresh (or resume the latest)")
    if step not in steps:
        raise ValueError(f"checkpoint.load_step={step}: {folder} has no complete step-{step}; its complete "
                         f"checkpoints are steps {sorted(steps)}")


def previous_run_config(job_config) -> dict | None:
    """The settings of the latest earlier start of this job (`<dump_folder>/runs/*/config.toml`), if readable."""
    runs = os.path.join(job_config.job.dump_folder, RUNS_FOLDER)
    records = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
    try:
        return load_toml(os.path.join(runs, records[-1], CONFIG_FILE)) if records else None
    except (OSError, tomllib.TOMLDecodeError):
        return None


def check_resume(job_config) -> None:
    """A resume from the job's own checkpoint keeps the model flavor, dataset and sequence length of the run that
    wrote it (else the load fails with a page of size mismatches, or the data position belongs to another source
    or counts windows of another length), and is warned when it sets another `optimizer.lr`: the checkpoint's LR
    scheduler restores the old base LR."""
    if not job_config.checkpoint.enable or latest_checkpoint_step(job_config) is None:
        return
    before = previous_run_config(job_config)
    if before is None:
        return
    folder = os.path.join(job_config.job.dump_folder, job_config.checkpoint.folder)
    for key, now in (("model.flavor", job_config.model.flavor), ("training.dataset", job_config.training.dataset),
                     ("training.seq_len", job_config.training.seq_len)):
        then = get_key(before, key)
        if then is not None and then != now:
            raise ValueError(f"{key}={now!r} differs from {then!r} of the run that wrote the checkpoints in {folder}; "
                             "resume with the same value, or pass another --job.dump_folder (--checkpoint."
                             "initial_load_path takes a step's weights)")
    lr = get_key(before, "optimizer.lr")
    if lr is not None and lr != job_config.optimizer.lr:
        logger.warning(f"optimizer.lr={job_config.optimizer.lr} differs from {lr} of the run that wrote the "
                       f"checkpoint: the resumed LR schedule keeps {lr}; to change it, start another "
                       "job.dump_folder with checkpoint.initial_load_path")


def check_resume_tokenizer(job_config, fingerprint: str) -> None:
    """A resume from the job's own checkpoint uses the tokenizer its run trained with (`fingerprint`, recorded in
    run.json): the same ids mean other text under another tokenizer, even one of the same size."""
    if not job_config.checkpoint.enable or latest_checkpoint_step(job_config) is None:
        return
    runs = os.path.join(job_config.job.dump_folder, RUNS_FOLDER)
    records = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
    then = recorded_tokenizer(os.path.join(runs, records[-1])) if records else None
    if then is not None and then != fingerprint:
        raise ValueError(f"{tokenizer_setting(job_config.model)} gives the tokenizer {fingerprint}, "
                         "but the checkpoints in "
                         f"{os.path.join(job_config.job.dump_folder, job_config.checkpoint.folder)}"
                         f" were trained with {then}; resume with that tokenizer, or pass another --job.dump_folder")


def check_data_parallel_degree(job_config, world_size: int) -> None:
    """A resume loads a checkpoint written with this job's data-parallel degree (its manifest records it): each
    data-parallel rank's data position is saved apart, so another degree cannot resume it, and an older step
    would not differ."""
    checkpoint = job_config.checkpoint
    folder = os.path.join(job_config.job.dump_folder, checkpoint.folder)
    if not checkpoint.enable or "dataloader" in checkpoint.exclude_from_loading:
        return
    step = latest_checkpoint_step(job_config) if checkpoint.load_step == -1 else checkpoint.load_step
    if step is None:
        return
    try:
        then = (read_manifest(os.path.join(folder, f"step-{step}")) or {}).get("data_parallel_degree")
    except UnreadableManifest:  # a damaged step, which the resume passes over with a warning
        return
    now = data_parallel_degree(job_config, world_size)
    if then is not None and then != now:
        raise ValueError(f"{folder}/step-{step} was written by a run with {then} data-parallel rank(s), and this one "
                         f"has {now}: each rank's data position is saved apart, so resume with {then} data-parallel "
                         "rank(s) (torchrun --nproc_per_node, [parallelism]), or pass another --job.dump_folder to "
                         f"start over (--checkpoint.initial_load_path {folder}/step-{step} takes its weights)")


WANDB_OFFLINE_MODES = ("offline", "disabled", "dryrun")


def wandb_logged_in(environ: Mapping[str, str]) -> bool:
    """Whether W&B has an API key: `WANDB_API_KEY`, or a netrc entry (`wandb login` writes one) for its host."""
    if environ.get("WANDB_API_KEY"):
        return True
    host = urllib.parse.urlparse(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_wandb(job_config, environ: Mapping[str, str]) -> None:
    """`metrics.enable_wandb` can log: the wandb package is installed, and W&B runs offline or has an API key
    (torchtitan would log an error and train without W&B)."""
    if not job_config.metrics.enable_wandb:
        return
    if importlib.util.find_spec("wandb") is None:
        raise ValueError("metrics.enable_wandb=true needs the wandb package (pip install wandb)")
    mode = environ.get("WANDB_MODE", "")
    if mode not in WANDB_OFFLINE_MODES and not wandb_logged_in(environ):
        raise ValueError(f"metrics.enable_wandb=true, but W&B has no API key (no WANDB_API_KEY, no netrc entry from "
                         f"`wandb login`) and WANDB_MODE={mode!r} is not offline: log in, set WANDB_API_KEY or "
                         "WANDB_MODE=offline, or leave metrics.enable_wandb off")


def check_dense_layers_leave_lighthouse(job_config, n_layers: int) -> None:
    """With Lighthouse enabled, `dense_layers` leaves at least one layer to run it."""
    section = job_config.lighthouse
    if section.enable and n_layers and set(section.dense_layers) >= set(range(n_layers)):
        raise ValueError(f"[lighthouse] dense_layers={list(section.dense_layers)} covers all {n_layers} layers "
                         "with enable=true: no layer runs Lighthouse; set enable = false for a dense run")


def check_validation_data(job_config, world_size: int) -> None:
    """`validation.dataset = "local"` files exist and hold bytes (the held-out windows are read at each
    evaluation); the synthetic held-out corpus is given no path. One warning each for held-out files that cannot
    fill the windows without repeating text, and for held-out files that are the training files: either way the
    held-out loss measures less than it claims."""
    validation, training = job_config.validation, job_config.training
    if not validation.enable:
        return
    check_path_is_read("validation", validation.dataset, validation.dataset_path)
    if validation.dataset != "local":
        return
    files = match_local_files(validation.dataset_path, "validation.dataset_path")
    ranks = data_parallel_degree(job_config, world_size)
    warn_small_corpus(files, validation.steps * validation.local_batch_size * validation.seq_len * ranks,
                      "validation.dataset_path", f"the held-out windows (validation.steps={validation.steps} x "
                      f"local_batch_size={validation.local_batch_size} x seq_len={validation.seq_len} x {ranks} "
                      "data-parallel rank(s)): the held-out loss scores the same text again and again")
    if training.dataset == "local":
        shared = sorted({os.path.realpath(f) for f in files}
                        & {os.path.realpath(f) for f in match_local_files(training.dataset_path)})
        if shared:
            logger.warning(f"validation.dataset_path and training.dataset_path share {len(shared)} file(s) "
                           f"({shared[0]}{', ...' if len(shared) > 1 else ''}): the held-out loss is measured on "
                           "text the model trains on")


def missing_config_hint(job_config) -> str:
    """Why a job has torchtitan's defaults where a config file sets the recipe's (model.name 'llama3'): " (no
    config file was given ...)" or " (<file> is empty)"; "" when its file holds settings."""
    path = job_config.job.config_file
    if not path:
        return " (no config file was given: pass --job.config_file, e.g. configs/debug.toml)"
    try:
        empty = not load_toml(path)
    except (OSError, ValueError):  # read once already; whatever changed since is not this message's to name
        return ""
    return f" ({path} is empty: it sets nothing, so every key keeps torchtitan's default)" if empty else ""


def check_settings(job_config, n_layers: int) -> None:
    """The checks of the settings alone (nothing on disk, no device), for a model of `n_layers` layers."""
    check_optimizer(job_config)
    check_rewarm(job_config)
    check_loop(job_config)
    check_checkpoint_loads(job_config)
    check_activation_checkpoint(job_config)
    check_seed(job_config)
    check_no_nan(job_config)
    check_compile(job_config)
    check_dense_layers_leave_lighthouse(job_config, n_layers)


def check_environment(job_config) -> None:
    """The checks of the settings against this machine and job: the processes (WORLD_SIZE, which torchrun and
    train.py set and torchtitan reads), W&B's login, CUDA, the data, the dump folder and the checkpoint a resume
    loads."""
    check_launch(job_config, os.environ)
    check_wandb(job_config, os.environ)
    check_parallelism(job_config, int(os.environ.get("WORLD_SIZE", "1")))
    check_device(job_config)
    check_training_data(job_config)
    check_validation_data(job_config, int(os.environ.get("WORLD_SIZE", "1")))
    check_dump_folder(job_config)
    check_resume(job_config)
    check_data_parallel_degree(job_config, int(os.environ.get("WORLD_SIZE", "1")))
