"""Runs that explain themselves: each start of train.py leaves its resolved config, command, commit, versions
and card in the dump folder, and marks in metrics.jsonl where its steps begin."""
import datetime
import json
import os
from pathlib import Path

import pytest
import torch

from recipe.compat import cpu as cpu_compat
from recipe.logs import run_logs, run_record
from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.logs.metrics import JsonlLogger
from recipe.toml_config import tomllib
from recipe.train.cli import parse_job_config
from recipe.logs.run_record import (COMMIT_ENV, CONFIG_FILE, LIBRARIES, NOT_INSTALLED, RUN_FILE, RUN_START, RUNS_FOLDER,
                               library_versions, run_start_record, source_commit, to_toml, write_run_record)

from .helpers import train_in_one_process

REPO = Path(__file__).resolve().parent.parent


def without_config_file(config) -> dict:
    """The job config as a dict, less `job.config_file` (the file it was read from)."""
    values = config.to_dict()
    values["job"].pop("config_file")
    return values


@pytest.mark.parametrize("config_file, overrides", [
    ("configs/debug.toml", ["--lighthouse.topk", "64", "--lighthouse.dense_layers", "1", "3", "--training.steps", "7"]),
    ("configs/paper/stage2_dense.toml", []),
    ("configs/long_context/stage1_L3_p4_k2048_norm_256k_cp4.toml", ["--optimizer.lr", "1e-4"]),
])
def test_the_recorded_config_reads_back_as_the_job_that_ran(tmp_path, config_file, overrides):
    config = parse_job_config(["--job.config_file", config_file, *overrides])
    recorded = tmp_path / CONFIG_FILE
    recorded.write_text(to_toml(config.to_dict()))
    assert without_config_file(parse_job_config(["--job.config_file", str(recorded)])) == without_config_file(config)


def test_toml_writes_every_value_kind_and_comments_out_none():
    text = to_toml({"a": {"flag": True, "n": 3, "x": 1e-8, "inf": float("inf"), "s": 'say "hi"\n', "l": [1, 2],
                          "ll": [["a"], []], "missing": None, "sub": {"k": "v"}}})
    assert tomllib.loads(text) == {"a": {"flag": True, "n": 3, "x": 1e-8, "inf": float("inf"), "s": 'say "hi"\n',
                                         "l": [1, 2], "ll": [["a"], []], "sub": {"k": "v"}}}
    assert "# missing = None (TOML has no null)" in text


def test_each_start_gets_its_own_record_folder_with_command_commit_card_and_versions(tmp_path):
    config = parse_job_config(["--job.config_file", "configs/debug.toml", "--job.dump_folder", str(tmp_path)])
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    first = write_run_record(config, ["--job.config_file", "configs/debug.toml", "--job.dump_folder", "a b"], now)
    second = write_run_record(config, [], now)  # the same second: a suffix keeps both
    assert (first.name, second.name) == ("20260102-030405", "20260102-030405-2")
    assert first.parent == second.parent == tmp_path / RUNS_FOLDER
    record = json.loads((first / RUN_FILE).read_text())
    assert record["command"] == "train.py --job.config_file configs/debug.toml --job.dump_folder 'a b'"
    assert record["start"] == "2026-01-02T03:04:05+00:00" and record["cwd"] == os.getcwd()
    assert record["commit"] == source_commit(REPO) and record["commit"] != "unknown"
    assert record["versions"]["torch"] == torch.__version__ and "torchtitan" in record["versions"]
    assert record["card"] and record["world_size"] == int(os.environ.get("WORLD_SIZE", "1"))
    assert (first / CONFIG_FILE).is_file()
    assert run_start_record(11, first) == {"event": RUN_START, "step": 11, "time": record["start"],
                                           "commit": record["commit"], "record": f"{RUNS_FOLDER}/{first.name}"}


def test_the_versions_name_every_library_and_say_which_are_not_installed(monkeypatch):
    installed = run_record.importlib.metadata.version

    def version(name: str) -> str:
        if name == "triton":
            raise run_record.importlib.metadata.PackageNotFoundError(name)
        return installed(name) if name != "flash-attn" else "2.8.3"

    monkeypatch.setattr(run_record.importlib.metadata, "version", version)
    versions = library_versions()
    assert set(LIBRARIES) <= set(versions)
    assert versions["triton"] == NOT_INSTALLED and versions["flash-attn"] == "2.8.3"
    assert versions["torch"] == installed("torch")


def write_metrics(path: Path, records: list[dict]) -> None:
    jsonl = JsonlLogger(str(path))
    for record in records:
        if "event" in record:
            jsonl.write(record)
        else:
            jsonl.log({k: v for k, v in record.items() if k != "step"}, record["step"])
    jsonl.close()


def test_readers_of_metrics_jsonl_skip_run_start_records(tmp_path):
    loss, tps = run_logs.LOSS_TAG, run_logs.TPS_TAG
    steps = [{"step": s, loss: 10.0 - s, tps: 100.0 + s} for s in (1, 2, 3, 4)]
    resumed = [{"step": s, loss: 20.0 - s, tps: 200.0 + s} for s in (3, 4, 5)]
    start = {"event": RUN_START, "time": "2026-01-02T03:04:05+00:00", "commit": "abc1234", "record": "runs/x"}
    plain, marked = tmp_path / "plain" / METRICS_FILE, tmp_path / "marked" / METRICS_FILE
    write_metrics(plain, steps + resumed)
    write_metrics(marked, [{**start, "step": 1}, *steps, {**start, "step": 3}, *resumed])
    assert read_metrics(str(marked)) == read_metrics(str(plain)) == steps + resumed
    logs = {name: run_logs.read_logs(path.parent) for name, path in (("plain", plain), ("marked", marked))}
    for tag in (loss, tps):  # a point's wall_time is its line number, which the extra records shift
        latest = {name: run_logs.latest(log, tag) for name, log in logs.items()}
        assert (latest["marked"].step, latest["marked"].value) == (latest["plain"].step, latest["plain"].value)
        assert run_logs.steady_median(logs["marked"], tag) == run_logs.steady_median(logs["plain"], tag)
        assert run_logs.peak(logs["marked"], tag) == run_logs.peak(logs["plain"], tag)


@pytest.fixture(scope="module")
def started_twice(tmp_path_factory):
    """The debug job started three times into one folder, in one process: 2 steps, then resumed to step 3, then
    once more with nothing left to train."""
    folder = tmp_path_factory.mktemp("twice") / "run"
    common = ["--job.config_file", "configs/debug.toml", "--job.dump_folder", str(folder), "--training.seq_len", "256",
              "--training.local_batch_size", "1", "--metrics.log_freq", "1", "--checkpoint.enable",
              "--checkpoint.no-last-save-model-only"]
    argvs = [common + ["--training.steps", "2"], common + ["--training.steps", "3"], common + ["--training.steps", "3"]]
    out = train_in_one_process(argvs)
    assert out.returncode == 0, out.stderr[-3000:]
    return folder, argvs, out.stdout + out.stderr


@pytest.mark.slow
def test_a_resumed_run_leaves_a_record_per_start_that_trains_and_marks_where_each_begins(started_twice):
    folder, argvs, log = started_twice
    records = sorted((folder / RUNS_FOLDER).iterdir())
    assert len(records) == 2
    runs = [json.loads((r / RUN_FILE).read_text()) for r in records]
    assert [r["command"] for r in runs] == [f"train.py {' '.join(argv)}" for argv in argvs[:2]]
    for record, argv in zip(records, argvs):
        assert without_config_file(parse_job_config(["--job.config_file", str(record / CONFIG_FILE)])) == \
            without_config_file(parse_job_config(argv))
    lines = [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines()]
    starts = [line for line in lines if line.get("event") == RUN_START]
    assert [(s["step"], s["record"], s["commit"], s["time"]) for s in starts] == [
        (1, f"{RUNS_FOLDER}/{records[0].name}", runs[0]["commit"], runs[0]["start"]),
        (3, f"{RUNS_FOLDER}/{records[1].name}", runs[1]["commit"], runs[1]["start"])]
    assert lines.index(starts[1]) == 3  # after steps 1 and 2, before step 3
    assert [r["step"] for r in read_metrics(str(folder / METRICS_FILE))] == [1, 2, 3]
    assert log.count(f"Output folder: {folder}") == 3
    nothing_left = [line for line in log.splitlines() if "Nothing left to train" in line]
    assert len(nothing_left) == 1 and nothing_left[0].endswith(
        "Nothing left to train: the job resumed at step 3 of training.steps=3; raise --training.steps to train on, "
        "or pass another --job.dump_folder to start over")
    assert [line.split("Training starts at ")[1] for line in log.splitlines() if "Training starts at" in line] == \
        ["step 1", "step 3"]  # not step 4 for the start with nothing left to train



@pytest.mark.slow
def test_a_finished_run_whose_last_save_holds_weights_alone_started_again_has_nothing_left_to_train(tmp_path):
    """A job started again after its end (a queue stopped as it finished, a requeued job) exits 0 and trains
    nothing, whether its last save is whole or weights alone (`last_save_model_only`): the weights are not read as
    a resume point, which would fail on the optimizer and data position they lack."""
    folder = tmp_path / "run"
    argv = ["--job.config_file", "configs/debug.toml", "--job.dump_folder", str(folder), "--training.seq_len", "256",
            "--training.local_batch_size", "1", "--training.steps", "2", "--checkpoint.enable",
            "--checkpoint.last_save_model_only"]
    out = train_in_one_process([argv, argv])
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert f"{folder}/checkpoint/step-2 holds the finished run's weights alone" in log
    assert "Nothing left to train: the job resumed at step 2 of training.steps=2" in log
    assert len(list((folder / RUNS_FOLDER).iterdir())) == 1, "the second start trained no step"

@pytest.mark.slow
def test_the_log_is_free_of_colour_codes_and_of_gpu_warnings_on_cpu(started_twice):
    log = started_twice[2]
    assert "\x1b[" not in log and "size: 853,632 total parameters" in log
    assert "Building llama3_lighthouse debug with {" in log and "debugwith" not in log
    if cpu_compat.on_cpu_only():
        for noise in ("lspci", "fallback to A100", "model.safetensors.index.json", "CPU autocast"):
            assert noise not in log
        assert log.count(cpu_compat.CpuLogFilter.MFU_NOTE) == 1


def test_a_copied_tree_names_its_commit_in_the_environment_over_stale_git_metadata(monkeypatch, tmp_path):
    monkeypatch.setenv(COMMIT_ENV, "4770319")
    assert source_commit(tmp_path) == "4770319", "outside git"
    assert source_commit(REPO) == "4770319", "inside a repository whose HEAD may not be the code that ran"
    monkeypatch.setenv(COMMIT_ENV, " ")
    assert source_commit(tmp_path) == "unknown"
