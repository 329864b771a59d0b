"""The tests' working folder (conftest.py): the checkout's inputs by their relative paths, none of what an
earlier run of the recipe left in the checkout, and nothing one test writes reaches the next."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

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
