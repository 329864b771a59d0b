"""The tests' working folder and seeds (conftest.py): the checkout's inputs by their relative paths, none of what
an earlier run of the recipe left in the checkout, nothing one test writes reaches the next, and each test draws
its random inputs from a seed of its own."""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy
import pytest
import torch

from conftest import seed_of
from recipe.train.cli import parse_job_config

from .helpers import REPO

QUICKSTART_CHECKPOINT = Path("outputs/debug/checkpoint")  # where the README's quickstart leaves its checkpoint


def test_the_working_folder_reads_the_checkouts_files_by_relative_path():
    assert Path.cwd().resolve() != REPO
    assert Path("configs/debug.toml").resolve() == REPO / "configs" / "debug.toml"
    assert Path("train.py").resolve() == REPO / "train.py"
    assert not Path("outputs").exists() and not Path("sweeps").exists()


def test_the_debug_configs_outputs_land_in_the_working_folder():
    dump_folder = Path(parse_job_config(["--job.config_file", "configs/debug.toml"]).job.dump_folder)
    assert Path.cwd() in Path(os.path.abspath(dump_folder)).parents
    assert not (dump_folder / "checkpoint").exists()


@pytest.mark.parametrize("turn", ["first", "second"])
def test_a_checkpoint_one_test_leaves_is_not_seen_by_the_next(turn):
    assert not QUICKSTART_CHECKPOINT.exists()
    QUICKSTART_CHECKPOINT.mkdir(parents=True)


def test_each_test_draws_from_a_seed_of_its_own(request, seeded_random):
    assert seeded_random == seed_of(request.node.nodeid) != seed_of(request.node.nodeid + "x")
    expected = torch.Generator().manual_seed(seeded_random)
    assert torch.equal(torch.rand(4), torch.rand(4, generator=expected))
    assert random.random() == random.Random(seeded_random).random()
    assert numpy.random.random() == numpy.random.RandomState(seeded_random).random()
