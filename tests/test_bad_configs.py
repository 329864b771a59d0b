"""Bad values in the config files the user-facing commands read (a pay-off study TOML, ...) end as the bad inputs
of tests/test_bad_inputs.py do: exit code 2 and one line on stderr naming the file, the key and the value, with no
traceback, before any run starts.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import REPO, refused_line, script_exit_code

EXAMPLE_STUDY = REPO / "configs" / "payoff" / "example_cpu.toml"  # steps = 8, frontier = [4]


def study_with(tmp_path: Path, study: str = "", grid: str = "") -> Path:
    """The CPU example study with `study` lines added to [study] (a key given twice keeps the one added: TOML
    refuses a repeated key, so a replaced key's line is dropped) and `grid` lines to its first [[grid]] block."""
    head, blocks = EXAMPLE_STUDY.read_text().split("[[grid]]", 1)
    replaced = {line.split("=")[0].strip() for line in study.splitlines() if "=" in line}
    head = "\n".join(line for line in head.splitlines() if line.split("=")[0].strip() not in replaced)
    path = tmp_path / "study.toml"
    path.write_text(head.replace("[study]", f"[study]\n{study}") + f"\n[[grid]]\n{grid}" + blocks)
    return path


@pytest.mark.parametrize("study, grid, message", [
    # was: TypeError tracebacks (a path of another type, a warm-up that is a string)
    ("config = 3", "", "study.config = 3 must be a non-empty path"),
    ('run = ""', "", "study.run = '' must be a non-empty path"),
    ('warmup_steps = "x"', "", "study.warmup_steps = 'x' must be an integer >= 0"),
    # was: accepted, each run then handed a negative warm-up to train.py, or "yes" read as true
    ("warmup_steps = -1", "", "study.warmup_steps = -1 must be an integer >= 0"),
    ('dense = "yes"', "", "study.dense = 'yes' must be true or false"),
    # was: accepted, and the report failed on them after every run had trained
    ('group_threshold = "x"', "", "study.group_threshold = 'x' must be a finite number (a held-out loss)"),
    ("group_threshold = nan", "", "study.group_threshold = nan must be a finite number (a held-out loss)"),
    ("baseline = 3", "", "study.baseline = 3 must be a run name"),
    # was: a frontier run longer than the study it is the time-matched reference of
    ("frontier = [4, 20]", "", "study.frontier [20] must be below study.steps = 8: a frontier run is a dense run"),
    # was: accepted, and named a stage-1 run 'causal_s0_dla' whose train.py refused its dense layers
    ("", 'dense_layers = [["a"]]', "grid 1 dense_layers = [['a']] must be a list of lists of layer indices >= 0"),
])
def test_payoff_map_names_a_bad_study_value_in_one_line_before_any_run(tmp_path, monkeypatch, capsys, study, grid,
                                                                        message):
    path = study_with(tmp_path, study, grid)
    line = refused_line("payoff_map.py", ["tasks", str(path)], monkeypatch, capsys)
    assert line.startswith(f"error: {path}: {message}")


def test_payoff_map_names_a_study_config_that_is_no_toml(tmp_path, monkeypatch, capsys):
    # was: "error: Invalid value (at line 1, column 5)", naming neither the study nor its config
    config = tmp_path / "job.toml"
    config.write_text("x = = 1\n")
    path = study_with(tmp_path, f'config = "{config}"')
    line = refused_line("payoff_map.py", ["tasks", str(path)], monkeypatch, capsys)
    assert line.startswith(f"error: {path}: study.config = '{config}' cannot be read as TOML: Invalid value")


def test_the_example_study_still_plans_its_queue(tmp_path, monkeypatch, capsys):
    assert script_exit_code("payoff_map.py", ["tasks", str(study_with(tmp_path))], monkeypatch) in (0, None)
    assert "dense_s0_steps4" in capsys.readouterr().out


def test_sweep_create_writes_no_point_that_train_py_would_refuse_at_start_up(tmp_path, monkeypatch, capsys):
    # was: "ok steps-1", a TOML written and its job submitted, for train.py to refuse when it started
    out = tmp_path / "sweep"
    code = script_exit_code("sweep.py", ["create", str(REPO / "configs" / "debug.toml"), "--out", str(out),
                                         "--set", "training.steps", "-1", "1"], monkeypatch)
    assert code == 0
    printed = capsys.readouterr().out
    assert "invalid  steps-1  train.py would refuse it: training.steps=-1 must be >= 1" in printed
    assert sorted(path.name for path in out.glob("*.toml")) == ["debug-steps1.toml"]


@pytest.mark.parametrize("name", ["a/b", ".."])
def test_sweep_create_refuses_a_name_that_is_no_file_name(tmp_path, monkeypatch, capsys, name):
    # was: "sweep.py create: [Errno 2] No such file or directory: '/tmp/sweep-check-.../a/b-L3.toml'"
    argv = ["create", str(REPO / "configs" / "debug.toml"), "--out", str(tmp_path / "sweep"), "--levels", "3",
            "--name", name]
    assert script_exit_code("sweep.py", argv, monkeypatch) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"sweep.py create: error: argument --name: {name!r} must be a file name, without '/' (it prefixes every "
        "run's TOML)")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("under", ["", "x"])
def test_export_hf_refuses_an_out_folder_that_is_or_lies_under_a_file(tmp_path, monkeypatch, capsys, under):
    # was: NotADirectoryError's traceback for OUT under a file, after the checkpoint was read
    blocking = tmp_path / "file"
    blocking.write_text("")
    out = blocking / under if under else blocking
    argv = [str(tmp_path / "step-1"), str(out), "--allow-stage1"]
    assert script_exit_code("export_hf.py", argv, monkeypatch) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"export_hf.py: error: argument OUT: '{out}': {blocking} is a file, not a folder")


@pytest.mark.parametrize("value", ["", ","])
def test_payoff_map_refuses_an_only_that_names_no_task(monkeypatch, capsys, value):
    # was: an empty --only (an unset shell variable) listed, and `run` queued, the whole study
    line = refused_line("payoff_map.py", ["tasks", str(EXAMPLE_STUDY), "--only", value], monkeypatch, capsys)
    assert line.endswith(f"error: argument --only: {value!r} names no task: give comma-separated task names "
                         "(`tasks` lists them)")


@pytest.mark.parametrize("script", ["payoff_map.py", "gpu_queue.py"])
@pytest.mark.parametrize("value, fault", [
    ("", "'': give comma-separated GPU indices >= 0, e.g. 0,1"),  # was: a queue waiting for a GPU forever
    ("-1", "'-1': give comma-separated GPU indices >= 0, e.g. 0,1"),
    ("0,0", "'0,0' repeats a GPU"),  # was: two runs at a time on one card
])
def test_a_queue_refuses_gpus_that_are_not_distinct_indices(tmp_path, monkeypatch, capsys, script, value, fault):
    def no_queue(*args: object) -> None:
        raise AssertionError("the queue started")

    monkeypatch.setattr("os.execv", no_queue)  # `run` hands its process to the queue
    study = study_with(tmp_path, f'run = "{tmp_path / "run"}"\ncorpus = "{tmp_path / "corpus"}"')
    argv = (["run", str(study)] if script == "payoff_map.py"
            else ["--tasks", str(tmp_path / "tasks.tsv"), "--logs", str(tmp_path / "logs")])
    line = refused_line(script, [*argv, f"--gpus={value}"], monkeypatch, capsys)
    assert line.endswith(f"error: argument --gpus: {fault}")
    assert not (tmp_path / "logs").exists()
