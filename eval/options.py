"""Parsers of command-line values shared by the scripts. Plain Python, so that the scripts that need only
torch and Triton (the GPU benchmarks) can use them without importing torchtitan."""
from __future__ import annotations


def int_list(text: str) -> list[int]:
    """Comma-separated integers of a command-line option, e.g. "2048,4096" ("" is the empty list)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from err


def selection_list(text: str) -> list[str]:
    """Comma-separated selection modes of a command-line option, each one of `LighthouseConfig`'s, e.g.
    "paper,causal,strict"; anything else is a usage error naming the allowed modes."""
    from argparse import ArgumentTypeError

    from lighthouse.config import SELECTIONS

    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in SELECTIONS for m in modes):
        raise ArgumentTypeError(f"{text!r}: give comma-separated modes among {', '.join(SELECTIONS)}")
    return modes
