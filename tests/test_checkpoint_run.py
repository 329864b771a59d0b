"""eval/checkpoint_run.py: which run record wrote a step folder, and whether its last steps ran Lighthouse."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.checkpoint import parse_job_config
from eval.checkpoint_record import run_record_of
from eval.checkpoint_run import trained_with_lighthouse, training_description
from recipe.logs.layout import CONFIG_FILE, METRICS_FILE, RUN_START, RUNS_FOLDER

DEBUG = ["--job.config_file", "configs/debug.toml"]


def make_dump(root: Path, records: list[str], starts: list[tuple[int, str]] | None, steps: list[int]) -> Path:
    """A dump folder with run record folders, a metrics.jsonl holding `starts` as (first step, record) run_start
    events between step records (none: no metrics.jsonl) and empty step folders."""
    for name in records:
        (root / RUNS_FOLDER / name).mkdir(parents=True)
        (root / RUNS_FOLDER / name / CONFIG_FILE).write_text(f'[job]\ndescription = "{name}"\n')
    if starts is not None:
        lines = []
        for step, name in starts:
            lines.append({"event": RUN_START, "step": step, "record": f"{RUNS_FOLDER}/{name}"})
            lines.append({"step": step, "loss": 5.0})
        (root / METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    for step in steps:
        (root / "checkpoint" / f"step-{step}").mkdir(parents=True)
    return root


def test_the_only_record_is_the_writer(tmp_path):
    dump = make_dump(tmp_path, ["20260101-000000"], None, [20])
    assert run_record_of(dump / "checkpoint" / "step-20") == dump / RUNS_FOLDER / "20260101-000000"


def test_a_step_belongs_to_the_last_start_that_began_at_or_before_it(tmp_path):
    first, resumed, restarted = "20260101-000000", "20260102-000000", "20260103-000000"
    dump = make_dump(tmp_path, [first, resumed, restarted], [(1, first), (301, resumed)], [300, 400])
    assert run_record_of(dump / "checkpoint" / "step-300") == dump / RUNS_FOLDER / first
    assert run_record_of(dump / "checkpoint" / "step-400") == dump / RUNS_FOLDER / resumed

    # A start from step 1 again (its checkpoints removed) wrote the step-300 that exists after it.
    starts = [(1, first), (301, resumed), (1, restarted)]
    dump = make_dump(tmp_path / "again", [first, resumed, restarted], starts, [300])
    assert run_record_of(dump / "checkpoint" / "step-300") == dump / RUNS_FOLDER / restarted


def test_several_records_and_no_start_events_name_the_way_out(tmp_path):
    dump = make_dump(tmp_path, ["20260101-000000", "20260102-000000"], None, [20])
    with pytest.raises(ValueError, match=r"cannot tell which of the 2 run records .* --job.config_file"):
        run_record_of(dump / "checkpoint" / "step-20")


def test_a_checkpoint_without_records_has_none(tmp_path):
    dump = make_dump(tmp_path, [], None, [20])
    assert run_record_of(dump / "checkpoint" / "step-20") is None


@pytest.mark.parametrize("overrides, step, lighthouse, words", [
    ([], 20, True, "lighthouse L3 p2 k32 m16 norm causal (dense layers [0])"),
    (["--lighthouse.switch_to_dense_at_step", "10"], 10, True, "lighthouse L3"),
    (["--lighthouse.switch_to_dense_at_step", "10"], 11, False, "dense from step 11, after lighthouse L3"),
    (["--lighthouse.no-enable"], 20, False, "dense"),
    (["--lighthouse.no-enable", "--checkpoint.initial_load_path", "stage1/step-8"], 20, False,
     "dense; started from stage1/step-8"),
], ids=["stage1", "at-the-switch", "after-the-switch", "dense-run", "stage2"])
def test_what_the_weights_trained_with(overrides, step, lighthouse, words):
    job_config = parse_job_config([*DEBUG, *overrides])
    assert trained_with_lighthouse(job_config, step) is lighthouse
    assert training_description(job_config, step).startswith(words)
