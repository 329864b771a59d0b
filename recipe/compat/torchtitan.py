"""The private parts of torchtitan 0.2.2 the recipe builds on: two ConfigManager hooks, the metrics rank, the
Trainer methods under torchelastic's @record and the wait that ends Trainer.train."""
from __future__ import annotations

import functools
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch.distributed as dist
import torchtitan.train
from torch.distributed.elastic.multiprocessing.errors import record
from torchtitan.components.metrics import _get_metrics_rank
from torchtitan.config import ConfigManager

from recipe.errors import ConfigError, RunStopped

TomlReader = Callable[[list[str]], "dict[str, Any] | None"]
ConfigExtender = Callable[[Callable[[], type], list[str], "dict[str, Any] | None"], type]
WAIT_LINE = "Sleeping 2 seconds for other ranks to complete"  # Trainer.train's log line before its closing wait


class HookedConfigManager(ConfigManager):
    """torchtitan's ConfigManager (TOML < command line < defaults, parsed by tyro) with its two private hooks
    handed to public functions: `read_toml(args)` reads the TOML values; `extend(base, args, toml_values)`
    returns the config class to parse into, `base()` being torchtitan's own (with `job.custom_config_module`
    merged in)."""

    def __init__(self, read_toml: TomlReader, extend: ConfigExtender) -> None:
        super().__init__()
        self.read_toml, self.extend = read_toml, extend

    def _maybe_load_toml(self, args: list[str]) -> dict[str, Any] | None:
        return self.read_toml(args)

    def _maybe_add_custom_config(self, args: list[str], toml_values: dict[str, Any] | None) -> type:
        base = super()._maybe_add_custom_config
        return self.extend(lambda: base(args, toml_values), args, toml_values)


def merge_configs(base: type, extension: type) -> type:
    """torchtitan's merge of a config extension's dataclasses into its JobConfig."""
    return ConfigManager._merge_configs(base, extension)


def metrics_rank(parallel_dims: Any, job_config: Any) -> int:
    """The global rank that logs metrics (torchtitan's choice: the last pipeline stage's first rank)."""
    return _get_metrics_rank(parallel_dims, job_config)


def without_stop_records(method: Callable) -> Callable:
    """A torchtitan Trainer `method` decorated with torchelastic's @record, recording every failure in the rank's
    error file but a stop (ConfigError, RunStopped): a stop's line is written there by rank 0 alone
    (`recipe.errors.exit_on_config_error`), so no other rank's record of the same stop can head torchrun's summary."""
    inner = method.__wrapped__  # @record keeps the function it wraps here (functools.wraps)

    @functools.wraps(inner)
    def call(*args: Any, **kwargs: Any) -> Any:
        stops: list[BaseException] = []

        @record
        def recorded() -> Any:
            try:
                return inner(*args, **kwargs)
            except (ConfigError, RunStopped) as stop:
                stops.append(stop)
                return None

        result = recorded()
        if stops:
            raise stops[0]
        return result

    return call


@contextmanager
def no_wait_for_other_ranks_alone() -> Iterator[None]:
    """Within it, torchtitan's Trainer.train skips its closing `time.sleep(2)` "for other ranks to complete" (and
    that line) when the job is one process: there is no other rank to wait for (2 s off every one-process run)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        yield
        return
    clock, quiet = torchtitan.train.time, lambda record: not record.getMessage().startswith(WAIT_LINE)
    torchtitan.train.time = types.SimpleNamespace(**{**vars(time), "sleep": lambda seconds: None})
    torchtitan.train.logger.addFilter(quiet)
    try:
        yield
    finally:
        torchtitan.train.time = clock
        torchtitan.train.logger.removeFilter(quiet)
