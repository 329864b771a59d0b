"""Parsers of command-line values shared by the scripts. Plain Python, so that the scripts that need only
torch and Triton (the GPU benchmarks) can use them without importing torchtitan."""
from __future__ import annotations

from argparse import ArgumentTypeError


def int_list(text: str) -> list[int]:
    """Comma-separated integers of a command-line option, e.g. "2048,4096" ("" is the empty list)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from err


def selection_list(text: str) -> list[str]:
    """Comma-separated selection modes of a command-line option, each one of `LighthouseConfig`'s, e.g.
    "paper,causal,strict"; anything else is a usage error naming the allowed modes."""
    from lighthouse.config import SELECTIONS

    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in SELECTIONS for m in modes):
        raise ArgumentTypeError(f"{text!r}: give comma-separated modes among {', '.join(SELECTIONS)}")
    return modes


def int_at_least(text: str, low: int) -> int:
    """`text` as an integer >= `low`, else argparse's usage error (exit code 2) naming the value."""
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise ArgumentTypeError(f"{value} must be >= {low}")
    return value


def positive_int(text: str) -> int:
    """argparse type of counts and lengths: an integer >= 1."""
    return int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type of counts that may be 0 (steps not timed)."""
    return int_at_least(text, 0)
