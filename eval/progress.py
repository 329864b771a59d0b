"""Progress bars of the evaluations that take more than a few seconds (NIAH, held-out loss, causality audit).

A tqdm bar on stderr, so stdout keeps only the results: shown when stderr is a terminal (`show=None`), always
(`True`) or never (`False`, the scripts' `--no-progress`).
"""
from __future__ import annotations

import sys

from tqdm import tqdm


def progress_bar(total: int, desc: str, show: bool | None = None) -> tqdm:
    """A bar of `total` steps named `desc`; `update()` it after each step and `close()` it at the end."""
    return tqdm(total=total, desc=desc, file=sys.stderr, disable=None if show is None else not show,
                dynamic_ncols=True)
