"""What a CPU trains in minutes a step, and the check that refuses a job sized for GPUs on a machine without one.

train.py runs `check_cpu_size_at_once` on its command line before it imports torch or torchtitan (20 s and more
on a CPU), so a GPU-sized config on a CPU ends in one line at once; `recipe.train.checks.check_size` applies the same
limits after the job is parsed, with torch's own view of the GPUs. Standard library only.
"""
from __future__ import annotations

import glob
from typing import Any, Sequence

from recipe.errors import ConfigError
from recipe.toml_config import get_key, load_toml_file

CONFIG_FILE_FLAGS = ("--job.config_file", "--job.config-file")
CPU_MAX_TOKENS = 2**20  # tokens per microbatch beyond which a CPU step takes hours, whatever the model
# Flavors sized for GPUs: the most tokens per microbatch a CPU trains in minutes a step (the paper model's 268M
# parameters take about 4 minutes a step at 8,192 tokens on a few cores).
CPU_MAX_TOKENS_BY_FLAVOR = {"paper": 8192}
# Where torchtitan's defaults apply (neither the TOML file nor the command line sets the key).
DEFAULTS = {"model.flavor": "debugmodel", "training.seq_len": 2048, "training.local_batch_size": 8,
            "comm.mode": "default", "job.dump_folder": "./outputs", "checkpoint.folder": "checkpoint",
            "checkpoint.enable": False, "checkpoint.initial_load_in_hf": False, "checkpoint.initial_load_path": None,
            "model.hf_assets_path": "./tests/assets/tokenizer"}
GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")  # NVIDIA, ROCm, WSL


def flag_value(args: Sequence[str], flags: Sequence[str], last: bool = True) -> str | None:
    """The value of the command line's `flags` (`--flag value` or `--flag=value`): the last one given (tyro's
    reading), or with `last=False` the first (torchtitan's reading of `--job.config_file`)."""
    values = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in flags and (eq or i + 1 < len(args)):
            values.append(value if eq else args[i + 1])
    return (values[-1] if last else values[0]) if values else None


def config_file_arg(args: Sequence[str]) -> str | None:
    """The `--job.config_file` value in `args` (either spelling, `--flag value` or `--flag=value`), as
    torchtitan's ConfigManager finds it."""
    return flag_value(args, CONFIG_FILE_FLAGS, last=False)


def cpu_size_error(flavor: str, local_batch_size: int, seq_len: int) -> str | None:
    """Why a CPU cannot train microbatches of `local_batch_size` x `seq_len` tokens of `flavor` (a message naming
    the values), or None when it can."""
    tokens, limit = local_batch_size * seq_len, CPU_MAX_TOKENS_BY_FLAVOR.get(flavor, CPU_MAX_TOKENS)
    if tokens <= limit:
        return None
    size = (f"training.seq_len={seq_len}" if local_batch_size == 1 else
            f"training.local_batch_size={local_batch_size} x training.seq_len={seq_len} = {tokens:,} tokens")
    return (f"{size} with the {flavor} flavor needs a GPU (none found): a CPU trains at most {limit:,} tokens per "
            "microbatch of it in minutes a step; use configs/debug.toml on CPU, or lower them")


def gpu_device_present() -> bool:
    """Whether this machine has a GPU device file (NVIDIA, ROCm or WSL), read without importing torch: without
    one, torch sees no GPU either."""
    return any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES)


def job_value(args: Sequence[str], toml_values: dict[str, Any], dotted: str) -> Any:
    """`dotted` as the job sets it: the command line over the TOML file over torchtitan's default."""
    section, key = dotted.split(".")
    given = flag_value(args, (f"--{dotted}", f"--{section}.{key.replace('_', '-')}"))
    if given is not None:
        return given
    value = get_key(toml_values, dotted)
    return DEFAULTS[dotted] if value is None else value


def job_switch(args: Sequence[str], toml_values: dict[str, Any], dotted: str) -> bool:
    """The boolean `dotted` as the job sets it: the command line's last `--section.key` / `--section.no-key` (tyro's
    flags, either spelling of the key) over the TOML file over torchtitan's default."""
    section, key = dotted.split(".")
    spellings = {key, key.replace("_", "-")}
    given = [arg.startswith(f"--{section}.no-") for arg in args
             if arg in {f"--{section}.{k}" for k in spellings} | {f"--{section}.no-{k}" for k in spellings}]
    if given:
        return not given[-1]
    value = get_key(toml_values, dotted)
    return DEFAULTS[dotted] if value is None else bool(value)


def read_job_file(args: Sequence[str]) -> dict[str, Any]:
    """The TOML of the command line's `--job.config_file` ({} without one); OSError or ValueError where it cannot
    be read (the full parse names why)."""
    path = config_file_arg(args)
    if path is None:
        return {}
    with open(path, "rb") as f:
        return load_toml_file(f)


def check_cpu_size_at_once(args: Sequence[str]) -> None:
    """On a machine without a GPU device, raise ConfigError (naming the config file) for a job sized for GPUs
    (`cpu_size_error`; a dry run, `comm.mode`, trains nothing), read from its TOML file and command line alone. What
    cannot be read here (a missing file,
    a value that is not a number, `--help`) is left to the full parse, which names it."""
    if gpu_device_present() or {"--help", "-h"} & set(args):
        return
    path = config_file_arg(args)
    try:
        toml_values = read_job_file(args)
        flavor = str(job_value(args, toml_values, "model.flavor"))
        batch, seq_len = (int(job_value(args, toml_values, key))
                          for key in ("training.local_batch_size", "training.seq_len"))
    except (OSError, ValueError, TypeError):  # tomllib's TOMLDecodeError is a ValueError
        return
    dry_run = job_value(args, toml_values, "comm.mode") != "default"  # builds the trainer, trains nothing
    if not dry_run and (error := cpu_size_error(flavor, batch, seq_len)) is not None:
        raise ConfigError(f"{path}: {error}" if path else error)
