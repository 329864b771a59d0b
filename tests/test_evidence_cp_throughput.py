"""scripts/cp_throughput.py: the per-rank arithmetic (eval.benchmarks.cp_throughput), a CPU run of the debug model at CP
degree 1 and 2, and the commit its records name."""
from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from eval.benchmarks import cp_throughput
from recipe.logs.run_record import source_commit

from .helpers import child_env, script_exit_code
from .warm_python import run_python

REPO = Path(__file__).resolve().parents[1]


def run_script(*argv: str) -> subprocess.CompletedProcess:
    """`python scripts/cp_throughput.py <argv>` from the repository root."""
    return run_python(["scripts/cp_throughput.py", *argv], env=child_env(), timeout=600)


def test_share_kept_and_speedup_are_per_rank_ratios_and_a_failed_or_missing_run_leaves_gaps():
    V = cp_throughput.Variant
    runs = {  # CP=8 ran Lighthouse only
        V(1, "lighthouse", False): {"tok_s": 1000.0, "peak_gib": 2.0},
        V(1, "dense", False): {"tok_s": 500.0, "peak_gib": 2.5},
        V(2, "lighthouse", False): {"tok_s": 900.0, "peak_gib": 1.5},
        V(2, "dense", False): {"tok_s": 250.0, "peak_gib": 1.8},
        V(4, "lighthouse", False): {"tok_s": 700.0, "peak_gib": 1.2}, V(4, "dense", False): {"error": "out of memory"},
        V(8, "lighthouse", False): {"tok_s": 600.0, "peak_gib": 1.0},
    }
    cp1, cp2, cp4, cp8 = cp_throughput.summarize(runs, [1, 2, 4, 8])
    assert cp1["lighthouse_kept_of_cp1"] == cp1["dense_kept_of_cp1"] == 1.0
    assert cp2["lighthouse_kept_of_cp1"] == pytest.approx(0.9) and cp2["dense_kept_of_cp1"] == pytest.approx(0.5)
    assert cp2["lighthouse_speedup"] == pytest.approx(3.6)
    assert cp4["lighthouse_kept_of_cp1"] == pytest.approx(0.7)
    assert cp4["dense_tok_s_per_rank"] is None and cp4["dense_kept_of_cp1"] is None
    assert cp4["lighthouse_speedup"] is None
    assert cp4["runs"]["dense"] == {"error": "out of memory"}
    assert cp8["lighthouse_kept_of_cp1"] == pytest.approx(0.6) and cp8["dense_tok_s_per_rank"] is None
    assert set(cp8["runs"]) == {"lighthouse"}


def test_each_dense_layer_set_and_compile_setting_is_a_record_against_the_one_dense_run_of_its_setting():
    V = cp_throughput.Variant
    runs = {V(2, "lighthouse", c, layers): {"tok_s": 100.0 * (1 + len(layers)) * (2 if c else 1)}
            for c in (False, True) for layers in ((0, 1, 28, 29), (0,), ())}
    runs |= {V(2, "dense", False): {"tok_s": 50.0}, V(2, "dense", True): {"tok_s": 100.0}}
    records = cp_throughput.summarize(runs, [2])
    assert [(r["compile"], r["dense_layers"]) for r in records] == [
        (c, layers) for c in (False, True) for layers in ([0, 1, 28, 29], [0], [])]
    assert [r["lighthouse_speedup"] for r in records] == [10.0, 4.0, 2.0, 10.0, 4.0, 2.0]
    assert all(r["lighthouse_kept_of_cp1"] is None for r in records)  # no CP=1 run: nothing to keep a share of
    assert records[4]["runs"]["dense"] is runs[V(2, "dense", True)]


def test_one_call_trains_lighthouse_per_dense_layer_set_and_dense_once_per_compile_setting(tmp_path):
    job = cp_throughput.CpThroughputJob("configs/long_context/stage1_L3_p4_k2048_norm_1m_cp2.toml", 524288, 3, "full",
                                        compile_modes=(False, True), dense_layer_sets=((0, 1, 28, 29), (0,), ()))
    names = [v.name for v in cp_throughput.variants(job, [2], list(cp_throughput.ATTENTIONS))]
    assert names == [f"{a}_cp2_{mode}{layers}" for mode in ("eager", "compiled") for a, layers in (
        ("lighthouse", "_dense-0-1-28-29"), ("lighthouse", "_dense-0"), ("lighthouse", "_dense-none"), ("dense", ""))]
    every_layer = cp_throughput.variant_args(job, cp_throughput.Variant(2, "lighthouse", True, ()), tmp_path)
    assert every_layer[every_layer.index("--lighthouse.dense_layers"):] == ["--lighthouse.dense_layers"]
    assert every_layer[every_layer.index("--training.seq_len") + 1] == "1048576"
    four = cp_throughput.variant_args(job, cp_throughput.Variant(2, "lighthouse", False, (0, 1, 28, 29)), tmp_path)
    assert four[four.index("--lighthouse.dense_layers"):] == ["--lighthouse.dense_layers", "0", "1", "28", "29"]
    assert "--compile.no-enable" in four and "--lighthouse.dense_layers" not in cp_throughput.variant_args(
        job, cp_throughput.Variant(2, "dense", False), tmp_path)


def test_every_degree_runs_on_as_many_processes_with_w_times_the_tokens(tmp_path):
    job = cp_throughput.CpThroughputJob("configs/debug.toml", tokens_per_rank=512, steps=3, ac="none", topk=64,
                                        train_args=["--lighthouse.dense_layers"])
    argv = cp_throughput.variant_args(job, cp_throughput.Variant(2, "lighthouse", False), tmp_path)
    assert argv[argv.index("--training.seq_len") + 1] == "1024"
    assert argv[argv.index("--parallelism.context_parallel_degree") + 1] == "2"
    assert argv[argv.index("--lighthouse.topk") + 1] == "64"
    assert "--lighthouse.enable" in argv and "--lighthouse.no-log-stats" in argv
    assert argv[-1] == "--lighthouse.dense_layers"  # extra train.py arguments come last, so they win
    dense = cp_throughput.variant_args(job, cp_throughput.Variant(1, "dense", False), tmp_path)
    assert "--lighthouse.no-enable" in dense
    assert "--compile.no-enable" in argv


def test_a_compiled_variant_compiles_the_model(tmp_path):
    job = cp_throughput.CpThroughputJob("configs/debug.toml", tokens_per_rank=512, steps=3, ac="full",
                                        compile_modes=(True,))
    for variant in cp_throughput.variants(job, [1, 2], list(cp_throughput.ATTENTIONS)):
        argv = cp_throughput.variant_args(job, variant, tmp_path)
        assert argv[argv.index("--compile.enable") + 1:][:2] == ["--compile.components", "model"]
        assert "--compile.no-enable" not in argv


@pytest.mark.parametrize("argv, message", [
    (["--cp", "1,x"], "--cp=1,x: 'x' is not an integer"),
    (["--cp", "1,0"], "--cp=1,0: 0 must be >= 1"),
    (["--tokens-per-rank", "-5"], "argument --tokens-per-rank: -5 must be >= 1"),
    (["--topk", "many"], "argument --topk: 'many' is not an integer"),
    (["--compile", "maybe"], "--compile='maybe': comma-separated values of off, on"),
    (["--dense-layers", "0,a"], "argument --dense-layers: '0,a' is not config, none or comma-separated layer numbers"),
    (["--dense-layers", "-1"], "argument --dense-layers: '-1': layer numbers are >= 0"),
    (["--stage2", "3", "--cp", "1,2"], "--stage2=3: give one --cp degree, one --compile setting"),
    (["--stage2", "2", "--cp", "2"], "--stage2=2: at least 3 (the first 2 steps are not timed)"),
    (["--resume"], "--resume keeps the variants of --json: name it"),
    (["--steps", "1"], "--steps=1: at least 3 (the first 2 steps are not timed)"),
    (["--warmup", "-1"], "argument --warmup: -1 must be >= 0"),
], ids=["cp-word", "cp-zero", "tokens-negative", "topk-word", "compile-word", "dense-layers-word",
        "dense-layers-negative", "stage2-two-degrees", "stage2-too-few", "resume-without-json", "steps-too-few",
        "warmup-negative"])
def test_bad_arguments_are_usage_errors_naming_the_value_in_one_line(argv, message, monkeypatch, capsys):
    code = script_exit_code("cp_throughput.py", argv, monkeypatch)
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines


def test_a_resume_keeps_the_measured_runs_and_refuses_records_of_other_settings(monkeypatch):
    trained = []

    def run_variant(argv, folder, steps, nproc, entry, timeout_s, warmup):
        trained.append(folder.name)
        return {"tok_s": 100.0, "peak_gib": 1.0}

    monkeypatch.setattr(cp_throughput, "run_variant", run_variant)
    monkeypatch.setattr(cp_throughput, "environment", lambda device: {"device": "test"})
    job = cp_throughput.CpThroughputJob("configs/debug.toml", tokens_per_rank=512, steps=3, ac="none",
                                        compile_modes=(False, True))
    first = cp_throughput.measure(job, [1], ["lighthouse", "dense"])
    first[1]["runs"]["dense"] = {"error": "out of memory"}  # compiled dense failed: trained again
    trained.clear()
    again = cp_throughput.measure(job, [1], ["lighthouse", "dense"], cp_throughput.measured_runs(first, job))
    assert trained == ["dense_cp1_compiled"] and again[1]["dense_tok_s_per_rank"] == 100.0
    one_step = dataclasses.replace(job, steps=1, warmup=0)  # a run of other steps joins the same records
    assert cp_throughput.measured_runs(again, one_step).keys() == cp_throughput.measured_runs(again, job).keys()
    trained.clear()  # another degree joins the same file: the earlier degree's records stay
    both = cp_throughput.measure(job, [2], ["lighthouse"], cp_throughput.measured_runs(again, job))
    assert trained == ["lighthouse_cp2_eager", "lighthouse_cp2_compiled"]
    assert [(r["cp_degree"], r["compile"]) for r in both] == [(1, False), (1, True), (2, False), (2, True)]
    other = dataclasses.replace(job, tokens_per_rank=1024)
    with pytest.raises(ValueError, match="measured with tokens_per_rank=512, this run has 1024"):
        cp_throughput.measured_runs(first, other)


CPU_RUN = ("--config", "configs/debug.toml", "--tokens-per-rank", "512", "--steps", "3", "--topk", "64", "--ac", "full",
           "--allow-cpu")


@pytest.mark.slow
def test_cpu_run_of_the_debug_model_at_cp_1_and_2_with_block_times_then_resumed(tmp_path):
    out = tmp_path / "cp.json"
    argv = (*CPU_RUN, "--cp", "1,2", "--layer-times", "--json", str(out), "--plot", str(tmp_path / "cp.png"))
    run = run_script(*argv)
    assert run.returncode == 0, run.stderr[-4000:]
    records = json.loads(out.read_text())
    assert cp_throughput.table(records) in run.stdout
    assert cp_throughput.layer_times_table(records) in run.stdout
    assert [(r["cp_degree"], r["seq_len"]) for r in records] == [(1, 512), (2, 1024)]
    for r in records:
        assert r["lighthouse_tok_s_per_rank"] > 0 and r["dense_tok_s_per_rank"] > 0
        assert r["lighthouse_speedup"] == pytest.approx(r["lighthouse_tok_s_per_rank"] / r["dense_tok_s_per_rank"])
        assert r["command"].startswith("cp_throughput.py --config configs/debug.toml")
        times = r["runs"]["lighthouse"]["layer_times"]  # the debug config: layer 0 dense, layers 1-3 Lighthouse
        assert (times["dense_layers"], times["lighthouse_layers"], times["timed_steps"]) == (1, 3, [3])
        assert times["dense_forward_s"] > 0 and times["lighthouse_backward_s"] > 0 and times["rest_s"] > 0
        assert times["dense_s"] + times["lighthouse_s"] + times["rest_s"] == pytest.approx(times["step_s"])
        assert r["runs"]["dense"]["layer_times"]["dense_layers"] == 4
    assert records[1]["lighthouse_kept_of_cp1"] == pytest.approx(
        records[1]["lighthouse_tok_s_per_rank"] / records[0]["lighthouse_tok_s_per_rank"])
    assert (tmp_path / "cp.png").stat().st_size > 0
    again = run_script(*argv, "--resume")  # every variant recorded: nothing trains, the records stay
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stdout.count("measured before, kept") == 4
    assert [r["runs"] for r in json.loads(out.read_text())] == [r["runs"] for r in records]


@pytest.mark.slow
def test_stage_2_resumes_the_stage_1_checkpoint_with_its_whole_state_on_cpu(tmp_path):
    out = tmp_path / "stage2.json"
    run = run_script(*CPU_RUN, "--cp", "2", "--stage2", "3", "--json", str(out))
    assert run.returncode == 0, run.stderr[-4000:]
    record = json.loads(out.read_text())
    assert cp_throughput.stage2_report(record) in run.stdout
    stage1, stage2 = record["runs"]["stage1"], record["runs"]["stage2"]
    assert len(stage1["tok_s_per_step"]) == len(stage2["tok_s_per_step"]) == 3 and stage2["tok_s"] > 0
    # Steps 4-6 go on from the stage-1 weights, optimizer and schedule: nowhere near a fresh start's loss.
    assert stage2["loss_per_step"][0] < stage1["loss_per_step"][0] - 0.5


@pytest.mark.slow
def test_records_name_the_commit_and_flag_a_tree_that_differs_from_it(tmp_path):
    assert source_commit(tmp_path) == "unknown"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "a.py").write_text("x = 1\n")
    for args in (["init", "-q"], ["add", "a.py"], ["commit", "-qm", "a"]):
        subprocess.run([*git, *args], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert source_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == f"{head}-dirty"


def test_a_failed_variant_is_recorded_with_its_error_and_the_sweep_goes_on(monkeypatch):
    def run_variant(argv, folder, steps, nproc, entry, timeout_s, warmup):
        if nproc == 2 and "--lighthouse.enable" in argv:
            raise RuntimeError("training failed (exit 1):\nHOP: Unsafe side effect")
        return {"tok_s": 100.0 * nproc, "peak_gib": 1.0}

    monkeypatch.setattr(cp_throughput, "run_variant", run_variant)
    monkeypatch.setattr(cp_throughput, "environment", lambda device: {"device": "test"})
    job = cp_throughput.CpThroughputJob("configs/debug.toml", tokens_per_rank=512, steps=3, ac="none",
                                        compile_modes=(True,))
    cp1, cp2 = cp_throughput.measure(job, [1, 2], list(cp_throughput.ATTENTIONS))
    assert cp2["runs"]["lighthouse"]["error"] == "training failed (exit 1):\nHOP: Unsafe side effect"
    assert cp2["runs"]["lighthouse"]["measured_by"]["environment"] == {"device": "test"}
    assert cp2["lighthouse_tok_s_per_rank"] is None and cp2["dense_tok_s_per_rank"] == 200.0
    assert cp1["compile"] is cp2["compile"] is True


def test_the_checked_in_1m_records_back_the_tables_and_numbers_of_the_docs(tmp_path):
    """docs/context_parallel.md's 1M-on-one-node section quotes its records: the block-time table verbatim,
    each variant's tok/s, the dense step and the speedups; every record names the card and commit."""
    records = json.loads((REPO / "docs" / "records" / "cp_throughput_1m_cp2.json").read_text())
    stage2 = json.loads((REPO / "docs" / "records" / "cp_stage2_1m_cp2.json").read_text())
    text = (REPO / "docs" / "context_parallel.md").read_text()
    assert cp_throughput.layer_times_table(records) in text
    dense = stage2["runs"]["stage2"]["tok_s"]
    for r in records:
        assert r["seq_len"] == 1_048_576 and r["config"] == "configs/long_context/stage1_L3_p4_k2048_norm_1m_cp2.toml"
        shown = f"{r['lighthouse_tok_s_per_rank']:,.0f}"
        assert f"{shown} tok/s" in text or f"{shown} /" in text
        run = r["runs"]["lighthouse"]["measured_by"]["environment"]
        assert (run["device"], run["commit"]) == ("NVIDIA H200", "945215e")
    compiled, eager = records[0]["lighthouse_tok_s_per_rank"], records[-1]["lighthouse_tok_s_per_rank"]
    assert f"{dense:,.0f} tok/s ({524_288 / dense:.1f} s a step)" in text
    assert f"{compiled / dense:.2f}x compiled, {eager / dense:.2f}x eager" in text
    assert stage2["runs"]["stage1"]["loss_per_step"] + stage2["runs"]["stage2"]["loss_per_step"] == pytest.approx(
        records[0]["runs"]["lighthouse"]["loss_per_step"][:2], abs=2e-3)  # stage 2 went on from step 1's state
    cp_throughput.plot(records, tmp_path / "1m.png")
    assert (tmp_path / "1m.png").stat().st_size > 0


def test_the_checked_in_2_gpu_probes_back_the_longest_context_cell():
    """The two single-length probes at 1M+ on 2 GPUs: 1,572,864 trains, 2,097,152 runs out of memory."""
    probes = [p for record in json.loads((REPO / "docs" / "records" / "max_context_2gpu_probes.json").read_text())
              for result in record["results"] for p in result["probes"]]
    assert [(p["seq_len"], p["fits"], p.get("error")) for p in probes] == [(2_097_152, False, "out of memory"),
                                                                            (1_572_864, True, None)]
    text = (REPO / "docs" / "context_parallel.md").read_text()
    assert f"**at least 1,572,864** (2 steps trained, peak {probes[1]['peak_gib']:.1f} GiB)" in text
