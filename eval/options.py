"""Parsers of command-line values shared by the scripts, the naming of an option whose values a later check refuses,
and the reader of a JSON file an option names. Plain Python, so that the scripts that need only torch and Triton
(the GPU benchmarks) can use them without importing torchtitan."""
from __future__ import annotations

import contextlib
import json
import os
from argparse import ArgumentTypeError
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from recipe.errors import ConfigError, file_in_the_way


def int_list(text: str) -> list[int]:
    """Comma-separated integers of a command-line option, e.g. "2048,4096" ("" is the empty list); anything else
    is argparse's usage error (exit code 2) naming the value."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not comma-separated integers, e.g. 2048,4096") from None


def positive_int_list(text: str) -> list[int]:
    """argparse type of lengths a script needs at least one of: comma-separated integers >= 1."""
    values = int_list(text)
    if not values:
        raise ArgumentTypeError(f"{text!r} names no value: give comma-separated integers >= 1, e.g. 2048,4096")
    if below := [value for value in values if value < 1]:
        raise ArgumentTypeError(f"{text!r}: {below} must be >= 1")
    return values


def gpu_list(text: str) -> str:
    """argparse type of the GPUs a queue runs on: comma-separated indices >= 0, at least one, none twice, given back
    as "0,1" (an empty list left a queue waiting for a GPU forever, a repeated one ran two tasks on one card)."""
    values = int_list(text)
    if not values or any(value < 0 for value in values):
        raise ArgumentTypeError(f"{text!r}: give comma-separated GPU indices >= 0, e.g. 0,1")
    if len(set(values)) != len(values):
        raise ArgumentTypeError(f"{text!r} repeats a GPU")
    return ",".join(map(str, values))


def _no_file_in_the_way(text: str, folder: str) -> Path:
    """`text` as a Path, else argparse's usage error naming the file that stands where `folder` is to be."""
    if (blocked := file_in_the_way(folder)) is not None:
        raise ArgumentTypeError(f"{text!r}: {blocked} is a file, not a folder")
    return Path(text)


def output_folder(text: str) -> Path:
    """argparse type of a folder a script writes: a path (an empty one wrote into the current folder unasked), and
    no file where it or a folder above it is to be, checked at start-up (the first write would fail with
    NotADirectoryError, after the work)."""
    if not text:
        raise ArgumentTypeError("'' names no folder: give its path (. for the current folder)")
    return _no_file_in_the_way(text, text)


def output_file(text: str) -> Path:
    """argparse type of a file (or path prefix: `<out>.json`) a script writes: a path that ends in a name ('', '.'
    and '/' end in none: IsADirectoryError or "has an empty name" after the work), and no file where its folder or
    one above it is to be, checked at start-up (an evaluation writes only after all its work)."""
    if not Path(text).name:
        raise ArgumentTypeError(f"{text!r} names no file: give a path that ends in a file name")
    return _no_file_in_the_way(text, os.path.dirname(os.path.abspath(text)))


def file_to_write(text: str) -> Path:
    """argparse type of a file a script writes under exactly this name (not a path prefix): `output_file`, and
    not an existing folder (the write would fail with IsADirectoryError, after the work)."""
    if os.path.isdir(text):
        raise ArgumentTypeError(f"{text!r} is a folder, not a file")
    return output_file(text)


def selection_list(text: str) -> list[str]:
    """Comma-separated selection modes of a command-line option, each one of `LighthouseConfig`'s, e.g.
    "paper,causal,strict"; anything else is a usage error naming the allowed modes."""
    from lighthouse.config import SELECTIONS

    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in SELECTIONS for m in modes):
        raise ArgumentTypeError(f"{text!r}: give comma-separated modes among {', '.join(SELECTIONS)}")
    return modes


def _integer(text: str) -> int:
    """`text` as an integer, else argparse's usage error (exit code 2) naming the value."""
    try:
        return int(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not an integer") from None


def int_at_least(text: str, low: int) -> int:
    """`text` as an integer >= `low`, else argparse's usage error (exit code 2) naming the value."""
    value = _integer(text)
    if value < low:
        raise ArgumentTypeError(f"{value} must be >= {low}")
    return value


def positive_int(text: str) -> int:
    """argparse type of counts and lengths: an integer >= 1."""
    return int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type of counts that may be 0 (steps not timed)."""
    return int_at_least(text, 0)


# The seeds torch.manual_seed and torch.Generator.manual_seed take (a negative one counts as 2**64 + seed).
TORCH_SEEDS = range(-2**63, 2**64)


def torch_seed(text: str) -> int:
    """argparse type of a seed of torch's generators: an integer in TORCH_SEEDS (another ended in torch's
    "Overflow when unpacking long long", after the model had loaded)."""
    value = _integer(text)
    if value not in TORCH_SEEDS:
        raise ArgumentTypeError(f"{value} is not a seed torch takes: give an integer in [-2**63, 2**64 - 1]")
    return value


@contextlib.contextmanager
def naming_option(flag: str, values: Sequence[int]) -> Iterator[None]:
    """Re-raise a ValueError of the checks inside, which refuse `values` (the integers the command line gave `flag`),
    as a ConfigError that starts with the option: `--lengths=32,256: NIAH lengths [32] are shorter ...` (the checks
    know the values, not the flag the user typed)."""
    try:
        yield
    except ValueError as err:
        raise ConfigError(f"{flag}={','.join(map(str, values))}: {err}") from err


def read_json(path: Path, flag: str, what: str, fits: Callable[[Any], bool]) -> Any:
    """The JSON value of `path`, named by `flag`, which must be `what` (`fits` says whether it is); a file that
    cannot be read, is not JSON or holds something else is a ConfigError naming it and what was expected."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{flag} {path} cannot be read ({err.strerror}); expected {what}") from None
    except ValueError as err:  # not JSON, or not UTF-8
        raise ConfigError(f"{flag} {path} is not JSON ({err}); expected {what}") from None
    if not fits(value):
        raise ConfigError(f"{flag} {path} holds a JSON {_json_kind(value)}; expected {what}")
    return value


# The JSON names of the Python types json.loads returns.
_JSON_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _json_kind(value: Any) -> str:
    """What `value` is in JSON's words; a non-empty array with the kinds of its items ("array of number, object"),
    which are what is wrong when an array was expected."""
    kind = _JSON_NAMES[type(value)]
    if isinstance(value, list) and value:
        kind += " of " + ", ".join(dict.fromkeys(_JSON_NAMES[type(item)] for item in value))
    return kind
