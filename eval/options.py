"""Parsers of command-line values shared by the scripts. Plain Python, so that the scripts that need only
torch and Triton (the GPU benchmarks) can use them without importing torchtitan."""
from __future__ import annotations


def int_list(text: str) -> list[int]:
    """Comma-separated integers of a command-line option, e.g. "2048,4096" ("" is the empty list)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from err
