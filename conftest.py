"""Settings and fixtures shared by the test suites under tests/ (the kernels' own under tests/kernels/).

- Without CUDA the Triton kernels run in Triton's interpreter: TRITON_INTERPRET=1 is set here, before any
  test module imports a kernel (Triton reads it when a kernel is defined), and is inherited by the
  processes tests start.
- Modules that need Triton begin with `pytest.importorskip("triton")`: without Triton they are reported
  as skipped, and every other test still runs.
- The recipe's compatibility layer is installed before any test module imports torchtitan, as `train.py`
  installs it (`recipe.compat.install`, a no-op with an accelerator).
- `ranks`: one pool of 2 CPU ranks in a gloo group for the whole session (tests/ranks.py).
- Marker `slow` (pyproject.toml): training processes, multi-rank groups, long end-to-end runs; the fast
  loop is `pytest -m "not slow"`.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from tests.ranks import RankPool

from recipe.compat import install

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
install()

RANK_POOL_WORLD = 2


@pytest.fixture(scope="session")
def ranks() -> Iterator[RankPool]:
    """The session's 2 gloo ranks; `ranks.run(check, degree, *args)` runs a check on each of them."""
    from tests.ranks import RankPool  # imported here: only sessions that start the pool need its imports

    pool = RankPool(RANK_POOL_WORLD)
    yield pool
    pool.close()
