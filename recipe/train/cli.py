"""Reading a job from its TOML file and the command line, with mistakes reported in one line.

`parse_job_config` reads a job through torchtitan's ConfigManager (TOML < command line < defaults, parsed by
tyro), with its two hooks (`recipe.compat.torchtitan.HookedConfigManager`) set to the values `read_toml` read (once) and
`with_lighthouse_section`: the `[lighthouse]` section is always known (so `train.py --help` lists it),
and a missing or malformed TOML file, an unknown key (with the closest valid one) or a value of the wrong
type raises `ConfigError` naming the file and key. `exit_on_config_error` turns a ConfigError into one line
on stderr (from rank 0 under torchrun) and exit code 2 (a `RunStopped`: its exit code); with `LIGHTHOUSE_DEBUG=1`
it re-raises, traceback
included. Mistakes on the command line itself are reported by tyro (a box naming the flag, with close
matches; exit code 2).
"""
from __future__ import annotations

import contextlib
import difflib
import json
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Callable, Iterator, Literal, Sequence

from torchtitan.config import JobConfig

from recipe.compat.torchtitan import HookedConfigManager, merge_configs
from recipe.train.cpu_size import CONFIG_FILE_FLAGS, config_file_arg  # noqa: F401  (read before torch is imported)
from recipe.errors import (  # noqa: F401  (the one-line exit lives with the errors; imported from here too)
    DEBUG_ENV, OTHER_RANKS_WAIT_S, ConfigError, RunStopped, debug_enabled, exit_on_config_error)
from recipe.toml_config import get_key, read_config_file
from recipe.train.job_config import JobConfig as LighthouseJobConfig


_TYPE_NAMES = {bool: ("true or false", "booleans"), int: ("an integer", "integers"), float: ("a number", "numbers"),
               str: ("a string", "strings")}


@contextlib.contextmanager
def as_config_error() -> Iterator[None]:
    """Re-raise a ValueError from the checks inside as a ConfigError (the checks raise ValueError only for
    mistakes in the job's settings)."""
    try:
        yield
    except ValueError as err:
        raise ConfigError(str(err)) from err


def _matches(value: Any, kind: Any) -> bool:
    """Whether a TOML value can be given to a field annotated `kind` (unknown annotations accept anything)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arm) for arm in args)
    if origin is Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and (not args or all(_matches(item, args[0]) for item in value))
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(kind, type) and kind is not typing.Any:
        return isinstance(value, kind)
    return True


def _describe(kind: Any) -> str:
    """What a field annotated `kind` takes, in words ("an integer", "a list of strings", "one of ...")."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in args if arm is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    if origin is list:
        return f"a list of {_TYPE_NAMES[args[0]][1]}" if args and args[0] in _TYPE_NAMES else "a list"
    return _TYPE_NAMES.get(kind, (getattr(kind, "__name__", str(kind)),))[0]


def check_toml(config_cls: type, values: dict[str, Any], section: tuple[str, ...] = ()) -> None:
    """Raise ConfigError for a key `config_cls` does not have (naming the closest one) or a value whose type
    its field does not take; sub-sections are checked recursively."""
    known = {f.name: f.type for f in fields(config_cls)}
    where = f"[{'.'.join(section)}] " if section else ""
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            if section:
                hint = f"did you mean {close[0]}?" if close else "train.py --help lists the keys"
                raise ConfigError(f"{where}{key} is not a key of [{'.'.join(section)}]; {hint}")
            hint = f"did you mean [{close[0]}]?" if close else "train.py --help lists the sections"
            raise ConfigError(f"[{key}] is not a section; {hint}")
        kind = known[key]
        if is_dataclass(kind):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{key} must be a table, [{'.'.join((*section, key))}]")
            check_toml(kind, value, (*section, key))
        elif not _matches(value, kind):
            raise ConfigError(f"{where}{key} = {json.dumps(value)} is not {_describe(kind)}")


def read_toml(args: list[str]) -> dict[str, Any] | None:
    """The values of the TOML file `args` name (`--job.config_file`), None if they name none; ConfigError for a
    file that cannot be read or is not TOML."""
    path = config_file_arg(args)
    if path is None:
        return None
    return read_config_file(path)


JOB_CONFIG_MODULE = LighthouseJobConfig.__module__
MOVED_JOB_CONFIG_MODULE = "recipe.job_config"  # its name before recipe/ was split into subpackages


def with_lighthouse_section(base: Callable[[], type], args: list[str], toml_values: dict[str, Any] | None) -> type:
    """torchtitan's config class (`base()`) with the `[lighthouse]` section merged in where the job's
    `custom_config_module` did not bring it; the TOML values checked against it (`check_toml`)."""
    try:
        config_cls = base()
    except ImportError as err:
        moved = f" (the recipe's module is now {JOB_CONFIG_MODULE!r})" if err.name == MOVED_JOB_CONFIG_MODULE else ""
        raise ConfigError(f"job.custom_config_module cannot be imported: {err}{moved}") from err
    if not any(f.name == "lighthouse" for f in fields(config_cls)):
        config_cls = merge_configs(config_cls, LighthouseJobConfig)
    if toml_values:
        try:
            check_toml(config_cls, toml_values)
        except ConfigError as err:
            raise ConfigError(f"{config_file_arg(args)}: {err}") from None
    return config_cls


def sets_key(args: Sequence[str], toml_values: dict[str, Any] | None, dotted: str) -> bool:
    """Whether the TOML file or the command line sets `dotted` (e.g. "validation.seq_len")."""
    flags = {f"--{dotted}", f"--{dotted.replace('_', '-')}"}
    return get_key(toml_values or {}, dotted) is not None or any(arg.partition("=")[0] in flags for arg in args)


def parse_job_config(args: Sequence[str]) -> JobConfig:
    """The job config of `args` (`--job.config_file X --section.key value ...`); ConfigError on a mistake.

    `validation.seq_len`, unless set, is `training.seq_len` (torchtitan's default, 2048, can exceed the RoPE
    table the model builds for `training.seq_len`)."""
    toml_values = read_toml(list(args))
    try:
        config = HookedConfigManager(lambda _args: toml_values, with_lighthouse_section).parse_args(list(args))
    except AssertionError as err:  # torchtitan's own checks of a section, run while the config is built
        if "validation steps" in str(err):
            raise ConfigError("validation.steps must be >= 1: the held-out windows are its first validation.steps "
                              "batches") from err
        raise ConfigError(f"torchtitan refuses the settings: {err}") from err
    if not sets_key(args, toml_values, "validation.seq_len"):
        config.validation.seq_len = config.training.seq_len
    return config
