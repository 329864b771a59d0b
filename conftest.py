"""Settings and fixtures shared by the test suites of tests/ and kernels/.

- Without CUDA the Triton kernels run in Triton's interpreter: TRITON_INTERPRET=1 is set here, before any
  test module imports a kernel (Triton reads it when a kernel is defined), and is inherited by the
  processes tests start.
- Modules that need Triton begin with `pytest.importorskip("triton")`: without Triton they are reported
  as skipped, and every other test still runs.
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

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

RANK_POOL_WORLD = 2


@pytest.fixture(scope="session")
def ranks() -> Iterator[RankPool]:
    """The session's 2 gloo ranks; `ranks.run(check, degree, *args)` runs a check on each of them."""
    # Imported here: tests.ranks imports `recipe`, which patches torchtitan on CPU; only sessions that
    # start the pool need that.
    from tests.ranks import RankPool

    pool = RankPool(RANK_POOL_WORLD)
    yield pool
    pool.close()
