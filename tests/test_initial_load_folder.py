"""`checkpoint.initial_load_path` may name a finished job's checkpoint folder: the job starts from the folder's
newest complete step with a manifest, the step a restart of that job would resume, and the setting is rewritten
to it (so the run record names the step); a folder none of whose steps will do is refused in one line."""
import os
from pathlib import Path

import pytest

import models  # noqa: F401  (before torchtitan)
from recipe.resilience.checkpoint_manifest import write_manifest
from recipe.train.cli import parse_job_config
from recipe.train.job_config import resolve_initial_load

REPO = Path(__file__).resolve().parent.parent


def finished_job(tmp_path: Path, steps=(), half_written=(), no_manifest=()) -> Path:
    """A checkpoint folder of another job: complete steps with manifests, steps without `.metadata` (saves cut
    short) and complete steps without a manifest."""
    folder = tmp_path / "earlier" / "checkpoint"
    for step in (*steps, *half_written, *no_manifest):
        (folder / f"step-{step}").mkdir(parents=True)
        (folder / f"step-{step}" / "__0_0.distcp").write_bytes(os.urandom(64))
    for step in (*steps, *no_manifest):
        (folder / f"step-{step}" / ".metadata").write_bytes(os.urandom(64))
    for step in steps:
        write_manifest(str(folder / f"step-{step}"), data_parallel_degree=1)
    return folder


def job(tmp_path: Path, initial_load_path: Path | str, *extra: str):
    return parse_job_config(["--job.config_file", str(REPO / "configs/debug.toml"), "--checkpoint.enable",
                             "--job.dump_folder", str(tmp_path / "this_job"),
                             "--checkpoint.initial_load_path", str(initial_load_path), *extra])


def test_a_checkpoint_folder_starts_from_its_newest_complete_step_with_a_manifest(tmp_path):
    folder = finished_job(tmp_path, steps=(250, 500), half_written=(750,), no_manifest=(600,))
    config = job(tmp_path, folder)
    assert resolve_initial_load(config) == str(folder / "step-500")
    assert config.checkpoint.initial_load_path == str(folder / "step-500")


def test_load_unverified_lets_the_newest_step_without_a_manifest_count(tmp_path):
    folder = finished_job(tmp_path, steps=(250,), no_manifest=(500,))
    config = job(tmp_path, folder, "--checkpoint.load_unverified")
    assert resolve_initial_load(config) == str(folder / "step-500")


@pytest.mark.parametrize("case", ["a step folder", "Hugging Face weights", "the job resumes its own checkpoints",
                                  "checkpointing is off"])
def test_the_setting_is_left_alone_where_it_is_not_a_folder_of_steps_the_job_would_read(tmp_path, case):
    folder = finished_job(tmp_path, steps=(250, 500))
    path, extra = folder, []
    if case == "a step folder":
        path = folder / "step-250"
    elif case == "Hugging Face weights":
        extra = ["--checkpoint.initial_load_in_hf"]
    elif case == "the job resumes its own checkpoints":
        (tmp_path / "this_job" / "checkpoint").mkdir(parents=True)
    config = job(tmp_path, path, *extra)
    if case == "checkpointing is off":
        config.checkpoint.enable = False
    assert resolve_initial_load(config) is None
    assert config.checkpoint.initial_load_path == str(path)


def test_a_folder_whose_steps_are_all_unfinished_or_unverified_is_refused_naming_them(tmp_path):
    folder = finished_job(tmp_path, half_written=(750,), no_manifest=(500,))
    config = job(tmp_path, folder)
    with pytest.raises(ValueError, match=r"^checkpoint.initial_load_path=.*is a checkpoint folder, but none of its "
                                         r"steps \(step-500, step-750\) is complete.*--checkpoint.load_unverified"):
        resolve_initial_load(config)
