"""eval/checkpoint_record.py: whether a step trained with Lighthouse, told from its run record alone (no torch or
torchtitan), is only ever answered when the record settles it, and then as the job's full parse answers it."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from eval.checkpoint_record import recorded_lighthouse_training
from eval.checkpoint_run import trained_with_lighthouse, training_description
from recipe.logs.layout import CONFIG_FILE, RUN_FILE, RUNS_FOLDER
from recipe.logs.run_record import to_toml
from recipe.train.cli import parse_job_config
from recipe.train.train_spec import job_model_args  # noqa: F401  (registers the llama3_lighthouse TrainSpec)
from torchtitan.protocols.train_spec import get_train_spec


def recorded_step(root: Path, step: int, *job_args: str, layers_recorded: bool = True) -> Path:
    """A step folder whose single run record is the debug job of `job_args`, as train.py records it (without
    `layers_recorded`: as a record from before run.json named the Lighthouse layers)."""
    job_config = parse_job_config(["--job.config_file", "configs/debug.toml", *job_args])
    record = root / RUNS_FOLDER / "20260101-000000"
    record.mkdir(parents=True)
    (record / CONFIG_FILE).write_text(to_toml(job_config.to_dict()))
    if layers_recorded:
        args = copy.deepcopy(get_train_spec(job_config.model.name).model_args[job_config.model.flavor])
        args.update_from_config(job_config)
        (record / RUN_FILE).write_text(json.dumps({"lighthouse_layers": args.lighthouse_layers()}))
    (root / "checkpoint" / f"step-{step}").mkdir(parents=True)
    return root / "checkpoint" / f"step-{step}"


def full_parse(folder: Path):
    return parse_job_config(["--job.config_file", str(folder.parents[1] / RUNS_FOLDER / "20260101-000000" /
                                                      CONFIG_FILE)])


@pytest.mark.parametrize("layers_recorded", [True, False])
@pytest.mark.parametrize("job_args", [("--lighthouse.dense_layers", "1"),
                                      ("--lighthouse.dense_layers", "1", "--lighthouse.switch_to_dense_at_step", "12"),
                                      ("--lighthouse.dense_layers", "1", "--lighthouse.switch_to_dense_at_step", "10")])
def test_a_step_that_trained_with_lighthouse_is_told_as_the_full_parse_tells_it(tmp_path, job_args, layers_recorded):
    folder = recorded_step(tmp_path, 10, "--training.steps", "20", *job_args, layers_recorded=layers_recorded)
    assert trained_with_lighthouse(full_parse(folder), 10)
    assert recorded_lighthouse_training(folder, []) == training_description(full_parse(folder), 10)


def test_the_recorded_layers_tell_what_dense_layers_alone_cannot(tmp_path):
    # the debug model's dense_layers [0] leaves Lighthouse in layers 1-3 only because the model has four layers
    told = recorded_step(tmp_path / "a", 10)
    assert recorded_lighthouse_training(told, []) == training_description(full_parse(told), 10)
    assert recorded_lighthouse_training(recorded_step(tmp_path / "b", 10, layers_recorded=False), []) is None
    every_layer = recorded_step(tmp_path / "c", 10, "--lighthouse.dense_layers", "0", "1", "2", "3")
    assert not trained_with_lighthouse(full_parse(every_layer), 10)
    assert recorded_lighthouse_training(every_layer, []) is None


@pytest.mark.parametrize("job_args", [("--lighthouse.no-enable",), ("--lighthouse.switch_to_dense_at_step", "5")])
def test_a_step_that_trained_dense_is_not_refused_early(tmp_path, job_args):
    folder = recorded_step(tmp_path, 10, "--training.steps", "20", *job_args)
    assert not trained_with_lighthouse(full_parse(folder), 10)
    assert recorded_lighthouse_training(folder, []) is None


def test_an_override_of_what_decides_it_is_left_to_the_full_parse(tmp_path):
    folder = recorded_step(tmp_path, 10)
    for override in (["--lighthouse.no-enable"], ["--training.steps=5"], ["--model.flavor", "small"]):
        assert recorded_lighthouse_training(folder, override) is None


def test_a_step_without_a_readable_record_is_left_to_the_full_parse(tmp_path):
    (tmp_path / "checkpoint" / "step-3").mkdir(parents=True)
    assert recorded_lighthouse_training(tmp_path / "checkpoint" / "step-3", []) is None
    folder = recorded_step(tmp_path / "broken", 3)
    (folder.parents[1] / RUNS_FOLDER / "20260101-000000" / CONFIG_FILE).write_text("[lighthouse\n")
    assert recorded_lighthouse_training(folder, []) is None
