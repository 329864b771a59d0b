"""scripts/max_context.py: the search for the longest context (doubling, then bisection on lengths the CP
geometry takes) against fake probes, what a probe's failure means, the table, the one-line argument errors,
and one real probe of the debug model on CPU."""
from __future__ import annotations

import json
import random
import runpy
import sys

import pytest

from eval.benchmarks import max_context
from lighthouse import LighthouseConfig

from .helpers import REPO, child_env, script_exit_code
from .warm_python import run_python

PAPER_K2048 = LighthouseConfig(levels=3, pool=4, topk=2048, tile_budget=128)


def counting(threshold: int):
    """A fake probe that fits every length up to `threshold`, and the lengths it was asked for."""
    asked: list[int] = []

    def fits(n: int) -> bool:
        asked.append(n)
        return n <= threshold

    return fits, asked


@pytest.mark.parametrize("seed", range(5))
def test_the_search_finds_the_longest_multiple_of_the_resolution_that_fits(seed):
    rng = random.Random(seed)
    start, resolution = 131072, 65536
    threshold = rng.randrange(start, 16 * start)
    fits, asked = counting(threshold)
    longest, failed = max_context.search(fits, start, resolution, limit=2**24)
    assert longest == threshold // resolution * resolution and failed == longest + resolution
    assert all(n % resolution == 0 and n >= start for n in asked) and len(set(asked)) == len(asked)
    assert len(asked) <= 4 + 1 + 5  # doublings to 16x, the first failure, log2(range / resolution) bisections


def test_a_start_that_does_not_fit_ends_the_search_without_probing_shorter_lengths():
    fits, asked = counting(100_000)
    assert max_context.search(fits, 131072, 65536, limit=2**24) == (None, 131072)
    assert asked == [131072]


def test_lengths_that_all_fit_stop_at_the_limit_with_no_failure():
    fits, asked = counting(10**9)
    assert max_context.search(fits, 131072, 65536, limit=1048576) == (1048576, None)
    assert asked == [131072, 262144, 524288, 1048576]


def test_the_geometry_step_is_whole_tiles_over_every_gpu_counts_chunks():
    assert max_context.geometry_step(PAPER_K2048, [1, 2, 4]) == 16 * 16  # p**(L-1) * 16 tiles; 2W divides it
    dilated = LighthouseConfig(levels=3, pool=2, topk=1536, tile_budget=128, scorer="dilated", dilation=4)
    assert max_context.geometry_step(dilated, [1, 2]) == 48  # 4 * 12 tiles and 2W * dilation = 16
    max_context.check_lengths(PAPER_K2048, 131072, 65536, [1, 2, 4])
    with pytest.raises(ValueError, match=r"--resolution=1000 is not a multiple of 256"):
        max_context.check_lengths(PAPER_K2048, 131072, 1000, [1, 2, 4])
    with pytest.raises(ValueError, match=r"--start=98304 is not a multiple of --resolution=65536"):
        max_context.check_lengths(PAPER_K2048, 98304, 65536, [1])
    with pytest.raises(ValueError, match=r"--start=4096 does not fit 1 GPU\(s\): each tile has 16 coarsest entries"):
        max_context.check_lengths(PAPER_K2048, 4096, 256, [1])


def fake_probes(outcomes: dict[int, dict]):
    """A stand-in for `probe`: each length's outcome (a fit unless named), and the lengths trained."""
    trained: list[int] = []

    def probe(job, gpus, attention, seq_len, folder):
        trained.append(seq_len)
        outcome = outcomes.get(seq_len, {"peak_gib": seq_len / 2**20})
        return {"seq_len": seq_len, "fits": "error" not in outcome, **outcome}

    return probe, trained


def test_out_of_memory_and_time_limits_bound_the_search_and_are_named_in_the_table(monkeypatch, tmp_path):
    outcomes = {2**21: {"error": "out of memory"}, 1572864: {"error": "timeout"}}
    probe, trained = fake_probes(outcomes)
    monkeypatch.setattr(max_context, "probe", probe)
    job = max_context.ProbeJob("configs/paper/stage1_L3_p4_k2048_norm.toml")
    result = max_context.find_longest(job, 2, "lighthouse", 2**19, 2**19, 2**24, tmp_path)
    assert (result["longest"], result["shortest_failed"], result["failed_because"]) == (2**20, 1572864, "timeout")
    assert trained == [2**19, 2**20, 2**21, 1572864]
    assert [p["seq_len"] for p in result["probes"]] == sorted(trained)
    assert max_context.table([result], [1, 2]).splitlines()[2:] == [
        "| 1 | not measured yet | not measured yet |",
        "| 2 | **1,048,576** (peak 1.0 GiB); 1,572,864: timeout | not measured yet |",
    ]
    trained.clear()  # a resumed search trains only what it has not recorded
    again = max_context.find_longest(job, 2, "lighthouse", 2**19, 2**19, 2**24, tmp_path,
                                     {p["seq_len"]: p for p in result["probes"] if p["seq_len"] != 2**21})
    assert trained == [2**21] and again["longest"] == 2**20


def test_a_first_probe_that_fails_for_another_reason_stops_the_search_and_a_later_one_is_a_bound(monkeypatch,
                                                                                                 tmp_path):
    crash = "training failed (exit 1):\n[rank0] ...\nerror: [lighthouse] topk=40 must be a positive multiple of 16\n"
    job = max_context.ProbeJob("configs/debug.toml")
    monkeypatch.setattr(max_context, "probe", fake_probes({512: {"error": crash}})[0])
    with pytest.raises(RuntimeError, match=r"^1 GPU\(s\), dense, 512 tokens: \[lighthouse\] topk=40 must be"):
        max_context.find_longest(job, 1, "dense", 512, 256, 4096, tmp_path)
    later = "training failed (exit 1):\nTraceback ...\nRuntimeError: CUDA error: an illegal memory access"
    monkeypatch.setattr(max_context, "probe", fake_probes({2048: {"error": later}})[0])
    result = max_context.find_longest(job, 1, "dense", 512, 256, 4096, tmp_path)
    assert (result["longest"], result["shortest_failed"]) == (1792, 2048)
    assert max_context.cell(result).endswith(
        "2,048: training failed (exit 1): RuntimeError: CUDA error: an illegal memory access")


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "1,two"], "--gpus=1,two: 'two' is not an integer"),
    (["--attentions", "sparse"], "--attentions=sparse: choose from ('lighthouse', 'dense')"),
    (["--compile", "maybe"], "--compile='maybe': one of off, on"),
    (["--start", "262144", "--max-len", "131072"], "--max-len=131072 is below --start=262144"),
    (["--resolution", "1000"], "--resolution=1000 is not a multiple of 256"),
    (["--start", "4096", "--resolution", "256"], "--start=4096 does not fit 1 GPU(s): each tile has 16"),
    (["--resume"], "--resume keeps the probes of --json: name it"),
    (["--config", "configs/nowhere.toml"], "cannot read config file configs/nowhere.toml"),
    (["--steps", "0"], "argument --steps: 0 must be >= 1"),
], ids=["gpus-word", "attention", "compile", "max-below-start", "resolution", "start-too-short", "resume",
        "config", "steps"])
def test_argument_errors_are_one_line_and_exit_code_2(argv, message, monkeypatch, capsys):
    code = script_exit_code("max_context.py", argv, monkeypatch)
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines


@pytest.mark.slow
def test_one_real_probe_of_the_debug_model_on_cpu(tmp_path):
    out, table = tmp_path / "max_context.json", tmp_path / "max_context.md"
    run = run_python(["scripts/max_context.py", "--config", "configs/debug.toml", "--gpus", "1", "--attentions",
                      "lighthouse", "--start", "512", "--resolution", "256", "--max-len", "512", "--compile", "off",
                      "--allow-cpu", "--json", str(out), "--markdown", str(table)], env=child_env(), timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    record = json.loads(out.read_text())
    [result] = record["results"]
    assert (result["longest"], result["shortest_failed"]) == (512, None)
    assert result["probes"][0]["fits"] and result["probes"][0]["peak_gib"] > 0
    assert record["settings"]["compile"] is False and record["environment"]["commit"]
    assert table.read_text().strip() == record["table"] and record["table"] in run.stdout
    assert "| 1 | **512** (peak " in record["table"]


def test_the_json_is_kept_whole_across_calls_and_a_resume_trains_only_new_probes(monkeypatch, capsys, tmp_path):
    probe, trained = fake_probes({2048: {"error": "out of memory"}, 1536: {"error": "out of memory"}})
    monkeypatch.setattr(max_context, "probe", probe)
    out = tmp_path / "max_context.json"
    argv = ["--config", str(REPO / "configs" / "debug.toml"), "--start", "512", "--resolution", "256", "--max-len",
            "4096", "--compile", "off", "--allow-cpu", "--json", str(out), "--resume", "--attentions", "lighthouse"]

    def search(*more: str) -> None:
        monkeypatch.setattr(sys, "argv", ["scripts/max_context.py", *argv, *more, "--", "--lighthouse.topk", "64"])
        runpy.run_path(str(REPO / "scripts" / "max_context.py"), run_name="__main__")

    search("--gpus", "1")
    search("--gpus", "2")
    assert trained == [512, 1024, 2048, 1536, 1280] * 2
    record = json.loads(out.read_text())
    assert record["settings"]["config"] == "configs/debug.toml"  # not the machine's checkout
    assert [(r["gpus"], r["longest"], r["shortest_failed"]) for r in record["results"]] == [(1, 1280, 1536),
                                                                                          (2, 1280, 1536)]
    assert record["results"][0]["probes"][0]["measured_by"]["command"].startswith("max_context.py --config")
    assert "| 2 | **1,280** (peak 0.0 GiB); 1,536: out of memory | not measured yet |" in record["table"]
    trained.clear()
    search("--gpus", "1,2")
    assert trained == [] and json.loads(out.read_text())["table"] == record["table"]
    other = [*argv, "--steps", "3", "--gpus", "1", "--", "--lighthouse.topk", "64"]
    assert script_exit_code("max_context.py", other, monkeypatch) == 2
    assert "was searched with other settings" in capsys.readouterr().err


def test_the_checked_in_1_gpu_search_is_a_finished_bisection_and_backs_its_table_cell():
    """docs/records/max_context_1gpu.json: one H200's Lighthouse search ends with a length that trains one resolution
    step
    below one that ran out of memory, every probe in between decided, and the docs show the script's own cell."""
    record = json.loads((REPO / "docs" / "records" / "max_context_1gpu.json").read_text())
    (result,) = [r for r in record["results"] if r["attention"] == "lighthouse"]
    probes = {p["seq_len"]: p["fits"] for p in result["probes"]}
    assert result["shortest_failed"] - result["longest"] == record["settings"]["resolution"]
    assert probes[result["longest"]] and not probes[result["shortest_failed"]]
    assert all(fits == (n <= result["longest"]) for n, fits in probes.items())
    text = (REPO / "docs" / "context_parallel.md").read_text()
    assert f"| 1 | {max_context.cell(result)} |" in text
    dense = {p["seq_len"]: p for p in record["searching"]["probes"]}
    assert record["searching"]["attention"] == "dense" and dense[524288]["fits"] and not dense[1048576]["fits"]
    assert (f"| **at least 524,288** (2 steps trained, peak {dense[524288]['peak_gib']:.1f} GiB" in text
            and "1,048,576 ran out of memory at step 1" in text)
