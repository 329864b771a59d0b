"""The GPU scripts' output paths, cp_throughput.py's --resume and --records files and max_context.py's --resume file
are checked at start-up: a bad one ends the script with exit code 2 and a last line on stderr naming the flag and
the path, no traceback, before the script asks for CUDA (these tests run where there is none) or does any work;
each script runs in a process of its own.
"""
from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from .helpers import REPO, child_env
from .warm_python import run_python

DEBUG = "configs/debug.toml"
MAX_CONTEXT = ["max_context.py", "--config", DEBUG, "--gpus", "1", "--start", "512", "--resolution", "256",
               "--max-len", "512", "--compile", "off"]


def script(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    """`python scripts/NAME ARGS` ({tmp} is tmp_path) to its end, from the checkout."""
    return run_python([f"scripts/{name}", *(arg.format(tmp=tmp_path) for arg in args)], env=child_env(), timeout=120)


def refused(result: subprocess.CompletedProcess) -> str:
    """The last line on stderr of a script that must have ended with a usage error, without a traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.splitlines()[-1]


@pytest.mark.parametrize("args, flag", [
    (["cp_throughput.py", "--json", "{tmp}/file/cp.json"], "--json"),  # was: after the first variant trained
    (["cp_throughput.py", "--records", "docs/records/cp_throughput_k1536.json", "--plot", "{tmp}/file/cp.png"],
     "--plot"),  # was: FileExistsError after the tables were printed
    ([*MAX_CONTEXT, "--json", "{tmp}/file/max.json"], "--json"),  # was: after the first probe
    ([*MAX_CONTEXT, "--markdown", "{tmp}/file/max.md"], "--markdown"),  # was: after the whole search
    (["bench_attention.py", "--out", "{tmp}/file/bench"], "--out"),  # was: NotADirectoryError on a GPU
    (["flash_attn_check.py", "--out", "{tmp}/file/flash"], "--out"),  # was: NotADirectoryError on a GPU
    (["golden_losses.py", "--write", "{tmp}/file/golden.json"], "--write"),  # was: after the training run
], ids=["cp-throughput-json", "cp-throughput-plot", "max-context-json", "max-context-markdown", "bench-attention",
        "flash-attn-check", "golden-losses"])
def test_an_output_path_under_a_file_is_refused_naming_the_flag_before_cuda_or_any_work(tmp_path, args, flag):
    (tmp_path / "file").write_text("x")
    out = args[args.index(flag) + 1].format(tmp=tmp_path)
    line = refused(script(tmp_path, *args))
    assert f"error: argument {flag}: '{out}': {tmp_path / 'file'} is a file, not a folder" in line


@pytest.mark.parametrize("args, flag", [
    (["cp_throughput.py", "--json", "{tmp}/folder"], "--json"),  # was: IsADirectoryError after the first variant
    ([*MAX_CONTEXT, "--json", "{tmp}/folder"], "--json"),
    ([*MAX_CONTEXT, "--markdown", "{tmp}/folder"], "--markdown"),
    (["golden_losses.py", "--write", "{tmp}/folder"], "--write"),  # was: IsADirectoryError after the training run
    (["run_agreement.py", "{tmp}", "{tmp}", "--json", "{tmp}/folder"], "--json"),  # was: after the comparison
    (["train_throughput.py", "--allow-cpu", "--json", "{tmp}/folder"], "--json"),  # was: after every variant
], ids=["cp-throughput-json", "max-context-json", "max-context-markdown", "golden-losses", "run-agreement",
        "train-throughput"])
def test_an_existing_folder_named_as_the_file_to_write_is_refused_naming_the_flag(tmp_path, args, flag):
    (tmp_path / "folder").mkdir()
    line = refused(script(tmp_path, *args))
    assert f"error: argument {flag}: '{tmp_path / 'folder'}' is a folder, not a file" in line


@pytest.mark.parametrize("records, refusal", [
    ([1, 2], " holds a JSON array of number; expected this script's records (an array of objects)"),  # AttributeError
    ([{}], ": record 1 has no 'cp_degree'; every record needs cp_degree, compile, runs"),  # KeyError
    ([{"cp_degree": 1, "compile": False, "runs": [1]}], ": record 1's 'runs' is not an object of runs (each an "
                                                        "object)"),  # AttributeError
    ([{"cp_degree": 1, "compile": False, "runs": {"dense": {"measured_by": {}}}}],
     ": record 1 has no 'runs.dense.measured_by.command'; runs.dense.measured_by needs command"),  # the plot reads it
], ids=["not-objects", "missing-key", "runs-not-objects", "run-measured-by-no-command"])
def test_cp_throughput_resume_names_a_json_file_that_is_not_its_records_before_cuda(tmp_path, records, refusal):
    earlier = tmp_path / "cp.json"
    earlier.write_text(json.dumps(records))
    line = refused(script(tmp_path, "cp_throughput.py", "--json", str(earlier), "--resume"))
    assert line == f"error: --resume: --json {earlier}{refusal}"


REPORTED = json.loads((REPO / "docs/records/cp_throughput_k1536.json").read_text())  # two records the report reads
REPORT_KEYS = ("config, tokens_per_rank, activation_checkpointing, steps, environment.device, environment.commit, "
               "cp_degree, seq_len, lighthouse_tok_s_per_rank, lighthouse_kept_of_cp1, lighthouse_peak_gib, "
               "dense_tok_s_per_rank, dense_kept_of_cp1, dense_peak_gib, lighthouse_speedup, runs")


def without(record: dict, key: str) -> dict:
    """`record` without `key`, or without the key of its environment in "environment.KEY"."""
    section, _, inner = key.partition(".")
    if inner:
        return {**record, section: {k: v for k, v in record[section].items() if k != inner}}
    return {k: v for k, v in record.items() if k != key}


@pytest.mark.parametrize("records, refusal", [
    ([{}], "record 1 has no 'config'"),  # was: KeyError in the report
    ([REPORTED[0], without(REPORTED[1], "seq_len")], "record 2 has no 'seq_len'"),
    ([REPORTED[0], without(REPORTED[1], "runs")], "record 2 has no 'runs'"),  # read by plot
    # the first record's card and commit title the plot (was: KeyError); its environment heads the report (was:
    # AttributeError, 'str' object has no attribute 'items')
    ([without(REPORTED[0], "environment.device"), REPORTED[1]], "record 1 has no 'environment.device'"),
    ([without(REPORTED[0], "environment.commit"), REPORTED[1]], "record 1 has no 'environment.commit'"),
    ([{**REPORTED[0], "environment": "H100"}, REPORTED[1]], "record 1 has no 'environment.device'"),
], ids=["empty-record", "no-seq-len", "no-runs", "no-device", "no-commit", "environment-not-an-object"])
def test_cp_throughput_records_names_the_file_and_a_key_the_report_or_plot_reads_once(tmp_path, records, refusal):
    given, plot = tmp_path / "cp.json", tmp_path / "cp.png"
    given.write_text(json.dumps(records))
    line = refused(script(tmp_path, "cp_throughput.py", "--records", str(given), "--plot", str(plot)))
    # was: "...; --records reads config, ... of every record", the flag named twice
    assert line == f"error: --records {given}: {refusal}; every record needs {REPORT_KEYS}"
    assert not plot.exists()


TIMED = json.loads((REPO / "docs/records/cp_throughput_1m_cp2.json").read_text())  # Lighthouse runs timed per block
LAYER_TIMES_KEYS = ("dense_layers, step_s, dense_s, dense_share, dense_forward_s, dense_backward_s, lighthouse_s, "
                    "lighthouse_share, lighthouse_forward_s, lighthouse_backward_s, rest_s, rest_share")


def timed_records() -> list[dict]:
    """A fresh copy of TIMED, each record with a dense run too: the Lighthouse run's copy (its layer_times unread)."""
    records = json.loads(json.dumps(TIMED))
    for record in records:
        record["runs"]["dense"] = json.loads(json.dumps(record["runs"]["lighthouse"]))
    return records


@pytest.mark.parametrize("attention, holder, needs, null", [
    ("lighthouse", "measured_by", "command", False),  # was: KeyError in the plot's title
    ("dense", "measured_by", "command", False),
    ("lighthouse", "layer_times", LAYER_TIMES_KEYS, False),  # was: KeyError in the block-time table
    ("lighthouse", "layer_times", LAYER_TIMES_KEYS, True),  # was: TypeError, 'NoneType' object is not subscriptable
], ids=["lighthouse-command", "dense-command", "layer-time", "layer-times-null"])
def test_cp_throughput_records_names_the_file_and_a_key_the_report_or_plot_reads_of_a_run(tmp_path, attention, holder,
                                                                                          needs, null):
    records, number = timed_records(), random.randint(1, len(TIMED))
    run = records[number - 1]["runs"][attention]
    key = needs.split(", ")[0] if null else random.choice(needs.split(", "))
    if null:
        run[holder] = None
    else:
        del run[holder][key]
    given, plot = tmp_path / "cp.json", tmp_path / "cp.png"
    given.write_text(json.dumps(records))
    line = refused(script(tmp_path, "cp_throughput.py", "--records", str(given), "--plot", str(plot)))
    missing = f"runs.{attention}.{holder}.{key}"
    assert line == (f"error: --records {given}: record {number} has no {missing!r}; runs.{attention}.{holder} needs "
                    f"{needs}")
    assert not plot.exists()


def test_cp_throughput_records_are_reported_without_what_neither_the_report_nor_the_plot_reads(tmp_path):
    """A run without measured_by, and a dense run's layer_times (only the Lighthouse run's are read), are no fault."""
    records = timed_records()
    del records[0]["runs"]["dense"]["layer_times"]["rest_s"]
    del records[-1]["runs"]["lighthouse"]["measured_by"]
    given, plot = tmp_path / "cp.json", tmp_path / "cp.png"
    given.write_text(json.dumps(records))
    run = script(tmp_path, "cp_throughput.py", "--records", str(given), "--plot", str(plot))
    assert run.returncode == 0, run.stderr
    assert "Where the Lighthouse step goes" in run.stdout and plot.exists()


MAX_CONTEXT_SETTINGS = {"config": DEBUG, "activation_checkpointing": "full", "compile": False, "steps": 2,
                        "timeout_s": 1800, "train_args": [], "start": 512, "resolution": 256, "max_len": 512}
SEARCH = {"gpus": 1, "attention": "dense", "probes": [{"seq_len": 512, "fits": True}]}


@pytest.mark.parametrize("searches, refusal", [
    ({"results": [{}]}, "results[0] has no 'gpus'; --resume reads gpus, attention, probes, longest, shortest_failed, "
                        "failed_because of it"),  # was: KeyError after the CUDA check
    ({"results": [], "searching": {"gpus": 1, "attention": "dense"}},
     "searching has no 'probes'; --resume reads gpus, attention, probes of it"),
    ({"results": [], "searching": {**SEARCH, "probes": [{"seq_len": 512}]}},
     "searching.probes[0] has no 'fits'; --resume reads seq_len, fits of it"),
    ({"results": [], "searching": {**SEARCH, "probes": 512}}, "searching.probes is not an array of probes"),
    ({"results": {}}, "'results' is not an array of searches"),
], ids=["result-without-gpus", "search-without-probes", "probe-without-fits", "probes-not-an-array",
        "results-not-an-array"])
def test_max_context_resume_names_the_search_and_key_its_json_lacks_before_cuda(tmp_path, searches, refusal):
    earlier = tmp_path / "max.json"
    earlier.write_text(json.dumps({"settings": MAX_CONTEXT_SETTINGS, **searches}))
    line = refused(script(tmp_path, *MAX_CONTEXT, "--json", str(earlier), "--resume"))
    assert line == f"error: --resume: --json {earlier}: {refusal}"
