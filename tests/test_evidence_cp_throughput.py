"""scripts/cp_throughput.py: the per-rank arithmetic (eval.cp_throughput), a CPU run of the debug model at CP
degree 1 and 2, and the commit its records name."""
from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from eval import cp_throughput
from recipe.run_record import source_commit

from .helpers import child_env

REPO = Path(__file__).resolve().parents[1]


def run_script(*argv: str) -> subprocess.CompletedProcess:
    """`python scripts/cp_throughput.py <argv>` from the repository root."""
    return subprocess.run([sys.executable, "scripts/cp_throughput.py", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=child_env())


def test_share_kept_and_speedup_are_per_rank_ratios_and_a_failed_or_missing_run_leaves_gaps():
    runs = {  # CP=8 ran Lighthouse only
        (1, "lighthouse"): {"tok_s": 1000.0, "peak_gib": 2.0}, (1, "dense"): {"tok_s": 500.0, "peak_gib": 2.5},
        (2, "lighthouse"): {"tok_s": 900.0, "peak_gib": 1.5}, (2, "dense"): {"tok_s": 250.0, "peak_gib": 1.8},
        (4, "lighthouse"): {"tok_s": 700.0, "peak_gib": 1.2}, (4, "dense"): {"error": "out of memory"},
        (8, "lighthouse"): {"tok_s": 600.0, "peak_gib": 1.0},
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


def test_every_degree_runs_on_as_many_processes_with_w_times_the_tokens(tmp_path):
    job = cp_throughput.CpThroughputJob("configs/debug.toml", tokens_per_rank=512, steps=3, ac="none", topk=64,
                                        train_args=["--lighthouse.dense_layers"])
    argv = cp_throughput.variant_args(job, 2, "lighthouse", tmp_path)
    assert argv[argv.index("--training.seq_len") + 1] == "1024"
    assert argv[argv.index("--parallelism.context_parallel_degree") + 1] == "2"
    assert argv[argv.index("--lighthouse.topk") + 1] == "64"
    assert "--lighthouse.enable" in argv and "--lighthouse.no-log-stats" in argv
    assert argv[-1] == "--lighthouse.dense_layers"  # extra train.py arguments come last, so they win
    assert "--lighthouse.no-enable" in cp_throughput.variant_args(job, 1, "dense", tmp_path)
    assert "--compile.no-enable" in argv


def test_a_compiled_job_compiles_the_model_in_every_variant(tmp_path):
    job = cp_throughput.CpThroughputJob("configs/debug.toml", tokens_per_rank=512, steps=3, ac="full", compile=True)
    for cp, attention in ((1, "dense"), (2, "lighthouse")):
        argv = cp_throughput.variant_args(job, cp, attention, tmp_path)
        assert argv[argv.index("--compile.enable") + 1:][:2] == ["--compile.components", "model"]
        assert "--compile.no-enable" not in argv


@pytest.mark.parametrize("argv, message", [
    (["--cp", "2,4"], "--cp=2,4: include 1, the baseline"),
    (["--cp", "1,x"], "--cp=1,x: 'x' is not an integer"),
    (["--cp", "1,0"], "--cp=1,0: 0 must be >= 1"),
    (["--tokens-per-rank", "-5"], "argument --tokens-per-rank: -5 must be >= 1"),
    (["--topk", "many"], "argument --topk: 'many' is not an integer"),
], ids=["no-baseline", "cp-word", "cp-zero", "tokens-negative", "topk-word"])
def test_bad_arguments_are_usage_errors_naming_the_value(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["scripts/cp_throughput.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / "cp_throughput.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err.splitlines()[-1], err


@pytest.mark.slow
def test_cpu_run_of_the_debug_model_at_cp_1_and_2(tmp_path):
    out = tmp_path / "cp.json"
    run = run_script("--config", "configs/debug.toml", "--tokens-per-rank", "512", "--steps", "3", "--topk", "64",
                     "--ac", "none", "--cp", "1,2", "--json", str(out), "--plot", str(tmp_path / "cp.png"),
                     "--allow-cpu")
    assert run.returncode == 0, run.stderr[-4000:]
    records = json.loads(out.read_text())
    assert cp_throughput.table(records) in run.stdout
    assert [(r["cp_degree"], r["seq_len"]) for r in records] == [(1, 512), (2, 1024)]
    for r in records:
        assert r["lighthouse_tok_s_per_rank"] > 0 and r["dense_tok_s_per_rank"] > 0
        assert r["lighthouse_speedup"] == pytest.approx(r["lighthouse_tok_s_per_rank"] / r["dense_tok_s_per_rank"])
    assert records[1]["lighthouse_kept_of_cp1"] == pytest.approx(
        records[1]["lighthouse_tok_s_per_rank"] / records[0]["lighthouse_tok_s_per_rank"])
    assert (tmp_path / "cp.png").stat().st_size > 0


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
    def run_variant(argv, folder, steps, nproc):
        if nproc == 2 and "--lighthouse.enable" in argv:
            raise RuntimeError("training failed (exit 1):\nHOP: Unsafe side effect")
        return {"tok_s": 100.0 * nproc, "peak_gib": 1.0}

    monkeypatch.setattr(cp_throughput, "run_variant", run_variant)
    monkeypatch.setattr(cp_throughput, "environment", lambda device: {"device": "test"})
    job = cp_throughput.CpThroughputJob("configs/debug.toml", tokens_per_rank=512, steps=3, ac="none", compile=True)
    cp1, cp2 = cp_throughput.measure(job, [1, 2], list(cp_throughput.ATTENTIONS))
    assert cp2["runs"]["lighthouse"] == {"error": "training failed (exit 1):\nHOP: Unsafe side effect"}
    assert cp2["lighthouse_tok_s_per_rank"] is None and cp2["dense_tok_s_per_rank"] == 200.0
    assert cp1["compile"] is cp2["compile"] is True
