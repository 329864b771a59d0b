"""Settings and fixtures shared by the test suites under tests/ (the kernels' own under tests/kernels/).

- Without CUDA the Triton kernels run in Triton's interpreter: TRITON_INTERPRET=1 is set here, before any
  test module imports a kernel (Triton reads it when a kernel is defined), and is inherited by the
  processes tests start; so is OMP_NUM_THREADS=1 (two workers on two cores: more threads only wait).
- Modules that need Triton begin with `pytest.importorskip("triton")`: without Triton they are reported
  as skipped, and every other test still runs.
- Every test runs in a fresh working folder of its own that holds links to the checkout's tracked files and
  folders (`configs/`, `train.py`, ...) and nothing else, so relative paths read the checkout's inputs but
  never meet what an earlier run left there (the quickstart's `./outputs/debug/checkpoint`, a `sweeps/`).
- The recipe's compatibility layer is installed before any test module imports torchtitan: importing `recipe`
  installs it, as in every entry point (`recipe.compat.install`, a no-op with an accelerator).
- Every test starts its random generators (torch, `random`, numpy) from a seed of its own, the CRC-32 of its node
  id: inputs stay random and differ from test to test, but a failure repeats on every run and every machine
  instead of showing up on a rare draw.
- `ranks`: one pool of 2 CPU ranks in a gloo group for the whole session (tests/ranks.py).
- Marker `slow` (pyproject.toml): training processes, multi-rank groups, long end-to-end runs, and every case
  listed in tests/long_cases.txt (measured over 3 s on 2 cores; tests/long_cases.py); the fast loop is
  `pytest -m "not slow"`.
"""
from __future__ import annotations

import functools
import os
import random
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy
import pytest
import torch

if TYPE_CHECKING:
    from tests.ranks import RankPool

import recipe  # noqa: F401,E402  (installs the compatibility layer, before any test module imports torchtitan)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # One intra-op thread, here and in every process a test starts (unless set otherwise): the suite runs two
    # workers on two cores, and a thread more per process only waits for a core (a CPU training run took about
    # 40% less CPU time with one).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parent
RANK_POOL_WORLD = 2


@functools.cache
def checkout_entries() -> list[Path]:
    """The checkout's top-level files and folders that git tracks (without git: all but `outputs` and `sweeps`,
    where the recipe's commands write by default)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        names = {path.split("/", 1)[0] for path in listed.stdout.split("\0") if path}
    else:
        names = {path.name for path in REPO.iterdir() if not path.name.startswith(".")} - {"outputs", "sweeps"}
    return sorted(REPO / name for name in names if (REPO / name).exists())


@pytest.fixture(autouse=True)
def fresh_working_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test in a folder of its own holding links to the checkout's tracked entries only
    (tests/test_test_isolation.py checks it)."""
    folder = tmp_path_factory.mktemp("cwd")
    for entry in checkout_entries():
        (folder / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    monkeypatch.chdir(folder)
    return folder


def seed_of(nodeid: str) -> int:
    """The seed of a test's random generators: the CRC-32 of its node id."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture(autouse=True)
def seeded_random(request: pytest.FixtureRequest) -> int:
    """Seed torch, `random` and numpy for this test (the module doc says why); returns the seed."""
    seed = seed_of(request.node.nodeid)
    torch.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed)
    return seed


@pytest.fixture(scope="session")
def ranks() -> Iterator[RankPool]:
    """The session's 2 gloo ranks; `ranks.run(check, degree, *args)` runs a check on each of them."""
    from tests.ranks import RankPool  # imported here: only sessions that start the pool need its imports

    pool = RankPool(RANK_POOL_WORLD)
    yield pool
    pool.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--ignore-long-cases", action="store_true",
                     help="do not mark the cases of tests/long_cases.txt slow (tests/long_cases.py reads the rest)")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--ignore-long-cases"):
        return
    long = set((REPO / "tests" / "long_cases.txt").read_text().splitlines())
    for item in items:
        if item.nodeid in long:
            item.add_marker(pytest.mark.slow)
