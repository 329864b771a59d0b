"""scripts/train_throughput.py: the Amdahl arithmetic and the out-of-memory path (eval.benchmarks.throughput), and a CPU
run
of the debug model."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.benchmarks import throughput
from recipe.errors import ConfigError

from .helpers import child_env, script_exit_code
from .warm_python import run_python

REPO = Path(__file__).resolve().parents[1]

ISSUE_KEYS = {"device", "seq_len", "model", "activation_checkpointing", "lighthouse_tok_s", "dense_tok_s",
              "lighthouse_peak_gib", "dense_peak_gib"}


@pytest.mark.parametrize("ac, dense_layer, lighthouse_layer", [("none", 0.030, 0.006), ("full", 0.040, 0.008)],
                         ids=["no-checkpointing", "full-checkpointing-repeats-the-forward"])
def test_amdahl_view_from_step_and_layer_times(ac, dense_layer, lighthouse_layer):
    times = {"dense_fwd_s": 0.010, "dense_fwd_bwd_s": 0.030, "lighthouse_fwd_s": 0.002, "lighthouse_fwd_bwd_s": 0.006}
    tokens, n_layers = 1000, 10
    dense_step, lighthouse_step = 1.0, 0.5  # seconds: 1000 and 2000 tok/s
    out = throughput.amdahl(tokens / dense_step, tokens / lighthouse_step, tokens, n_layers, times, ac)
    share = n_layers * dense_layer / dense_step
    assert out["lighthouse_layer_speedup"] == pytest.approx(dense_layer / lighthouse_layer)
    assert out["lighthouse_layers_attention_share_of_dense_step"] == pytest.approx(share)
    assert out["amdahl_ceiling"] == pytest.approx(1 / (1 - share))
    assert out["predicted_speedup"] == pytest.approx(dense_step
                                                     / (dense_step - n_layers * (dense_layer - lighthouse_layer)))
    assert out["speedup"] == pytest.approx(2.0)


def test_amdahl_view_without_a_dense_run_keeps_the_per_layer_speedup_only():
    times = {"dense_fwd_s": 1.0, "dense_fwd_bwd_s": 3.0, "lighthouse_fwd_s": 0.5, "lighthouse_fwd_bwd_s": 1.0}
    out = throughput.amdahl(None, 500.0, 1000, 4, times, "none")
    assert out["lighthouse_layer_speedup"] == pytest.approx(3.0)
    assert "speedup" not in out and "amdahl_ceiling" not in out


def test_a_variant_that_runs_out_of_memory_or_past_its_time_is_recorded_not_raised(monkeypatch, tmp_path):
    monkeypatch.setattr(throughput, "run_job", lambda *args: (1, "torch.OutOfMemoryError: CUDA out of memory."))
    assert throughput.run_variant([], tmp_path, 3) == {"error": "out of memory"}
    line = "error: out of memory at step 1 (CUDA out of memory. Tried to allocate 2.00 GiB): training.seq_len=..."
    monkeypatch.setattr(throughput, "run_job", lambda *args: (1, f"[rank0] starting\n{line}\n"))
    assert throughput.run_variant([], tmp_path, 3) == {"error": "out of memory", "line": line}
    monkeypatch.setattr(throughput, "run_job", lambda *args: (None, "step 1 ..."))
    assert throughput.run_variant([], tmp_path, 3, timeout_s=60) == {"error": "timeout", "timeout_s": 60}

    monkeypatch.setattr(throughput, "run_job", lambda *args: (1, "ValueError: topk=3"))
    with pytest.raises(RuntimeError, match="ValueError: topk=3"):
        throughput.run_variant([], tmp_path, 3)


REFUSAL = "error: [lighthouse] dense_layers=[99] has [99] outside the model's 4 layers (0..3)"


def test_a_setting_the_trainer_refuses_is_a_config_error_with_the_trainers_line(monkeypatch, tmp_path):
    """Exit code 2 from train.py, or from a rank under torchrun (which itself exits 1 and names the rank's code),
    is a refused setting, not a failed run; a line that merely starts with "error:" in another failure is not."""
    for code, output in [(2, f"starting\n{REFUSAL}\n"),
                         (1, f"[rank0] starting\n{REFUSAL}\n...\n  exitcode  : 2 (pid: 7)\n")]:
        monkeypatch.setattr(throughput, "run_job", lambda *args, out=(code, output): out)
        with pytest.raises(ConfigError) as refused:
            throughput.run_variant([], tmp_path, 3)
        assert f"error: {refused.value}" == REFUSAL
    monkeypatch.setattr(throughput, "run_job", lambda *args: (1, f"{REFUSAL}\n  exitcode  : 1 (pid: 7)\n"))
    with pytest.raises(RuntimeError, match="training failed"):
        throughput.run_variant([], tmp_path, 3)


@pytest.mark.parametrize("script", ["train_throughput.py", "cp_throughput.py"])
def test_a_refused_setting_stops_the_script_in_one_line_with_exit_2(script, monkeypatch, capsys):
    monkeypatch.setattr(throughput, "run_job", lambda *args: (2, f"starting\n{REFUSAL}\n"))
    argv = ["--allow-cpu", "--steps", "3"]
    if script == "cp_throughput.py":
        argv += ["--config", "configs/debug.toml", "--cp", "1"]
    assert script_exit_code(script, argv, monkeypatch) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == REFUSAL


def test_a_job_past_its_time_is_ended_with_every_process_it_started(tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            f"open({str(grandchild)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(120)")
    start = time.monotonic()
    exit_code, output = throughput.run_job([sys.executable, "-c", code], dict(os.environ), timeout_s=3)
    assert exit_code is None and "started" in output and time.monotonic() - start < 60
    pid = int(grandchild.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the job's own child outlived the timeout"
        time.sleep(0.05)


def test_only_the_steps_after_the_warm_up_are_timed_as_total_tokens_over_total_time(monkeypatch, tmp_path):
    per_step = [10.0, 20.0, 100.0, 50.0]  # tok/s of steps 1-4; steps 1 and 2 are warm-up

    def fake_run(first_step: int):
        def run_job(*args):
            rows = [{"step": first_step + i, throughput.TPS_TAG: tps, throughput.MEMORY_TAG: 2.0,
                     "memory/max_active(GiB)": 1.5, "tflops": 3.0, throughput.LOSS_TAG: 5.0 - i}
                    for i, tps in enumerate(per_step)]
            (tmp_path / throughput.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
            return 0, ""
        return run_job

    monkeypatch.setattr(throughput, "run_job", fake_run(1))
    run = throughput.run_variant([], tmp_path, 4)
    assert throughput.WARMUP_STEPS == 2
    assert run["tok_s"] == pytest.approx(2 / (1 / 100.0 + 1 / 50.0))  # 66.7, not the mean 75 nor with warm-up
    assert run["tok_s_per_step"] == per_step and run["loss_per_step"] == [5.0, 4.0, 3.0, 2.0]
    assert run["peak_gib"] == 2.0
    monkeypatch.setattr(throughput, "run_job", fake_run(11))  # a job resumed at step 10: its first two steps too
    assert throughput.run_variant([], tmp_path, 14)["tok_s"] == pytest.approx(2 / (1 / 100.0 + 1 / 50.0))


def test_too_few_steps_to_time_is_refused_naming_the_value(monkeypatch, capsys):
    assert throughput.too_few_steps(2) == "--steps=2: at least 3 (the first 2 steps are not timed)"
    assert throughput.too_few_steps(3) is None
    code = script_exit_code("train_throughput.py", ["--steps", "2"], monkeypatch)  # in this process: no start-up
    assert code == 2 and "--steps=2: at least 3" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--seq-len", "0"], "argument --seq-len: 0 must be >= 1"),
    (["--steps", "eight"], "argument --steps: 'eight' is not an integer"),
])
def test_bad_numbers_are_usage_errors_naming_the_value(argv, message, monkeypatch, capsys):
    code = script_exit_code("train_throughput.py", argv, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines()[-1].endswith(message), err


# A parent that starts a long child as run_variant does, prints the child's pid, and waits.
PARENT = """import subprocess, sys
from recipe.launch import end_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=end_with_parent)
print(child.pid, flush=True)
child.wait()
"""


def test_a_variant_job_ends_with_the_script_that_started_it():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the child outlived its killed parent"
        time.sleep(0.05)


@pytest.mark.parametrize("flag", ["--compile", "--colocate-autograd"])
def test_a_switch_other_than_off_or_on_is_refused_naming_the_flag(flag, monkeypatch, capsys):
    code = script_exit_code("train_throughput.py", [flag, "off,maybe"], monkeypatch)
    assert code == 2 and f"{flag}='off,maybe': comma-separated values of off, on" in capsys.readouterr().err


# A fresh vocabulary, a multiple of 64, so the model's vocabulary is exactly it.
VOCAB = 64 * (8 + os.getpid() % 8)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """The CPU smoke run of docs/troubleshooting.md (`--allow-cpu --config configs/debug.toml`) with `--vocab-size`:
    the two tests below read one run (a BPE vocabulary changes no default they check)."""
    out_json = tmp_path_factory.mktemp("smoke") / "tt.json"
    out = run_python(["scripts/train_throughput.py", "--allow-cpu", "--config", "configs/debug.toml", "--vocab-size",
                      str(VOCAB), "--json", str(out_json)], env=child_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    (record,) = json.loads(out_json.read_text())
    return out, record


@pytest.mark.slow
def test_the_cpu_smoke_run_is_small_by_default_and_says_what_it_trains(smoke_run):
    """The config's length, 3 steps, no activation checkpointing, and a line on stderr before each variant."""
    out, record = smoke_run
    assert ISSUE_KEYS <= set(record)
    assert record["activation_checkpointing"] == "none" and record["seq_len"] == 512 and record["steps"] == 3
    lines = [line for line in out.stderr.splitlines() if line.startswith("train_throughput: ")]
    assert [line.split(", ")[0] for line in lines] == [
        "train_throughput: training lighthouse ac=none compile=False colocate_autograd=False",
        "train_throughput: training dense ac=none compile=False colocate_autograd=False",
        "train_throughput: timing one attention call"]
    assert record["device"].startswith("CPU")
    assert "CPU smoke run: tok/s is 1 step(s) of 512 tokens" in out.stdout  # says why train.py's log reads higher
    assert record["lighthouse_tok_s"] > 0 and record["dense_tok_s"] > 0
    assert record["lighthouse_peak_gib"] > 0 and record["dense_peak_gib"] > 0
    assert record["lighthouse_layers"] == 3  # debug: 4 layers, layer 0 dense
    assert record["speedup"] == pytest.approx(record["lighthouse_tok_s"] / record["dense_tok_s"])


@pytest.mark.slow
def test_vocab_size_trains_both_variants_with_a_bpe_of_that_many_entries(smoke_run):
    """`--vocab-size N` (the cost of a larger output layer): a BPE of exactly N entries is built locally and both
    variants train with it; the record names the vocabulary."""
    _, record = smoke_run
    assert record["vocab_size"] == VOCAB and f"vocabulary {VOCAB:,}" in record["model"]
