"""Training throughput of one model variant, each variant trained in a job of its own, the time of one
attention call of the model's shape, and the Amdahl view of a per-layer attention speedup
(scripts/train_throughput.py, scripts/cp_throughput.py).

A variant trains the config with local batch 1 on synthetic data, without checkpoints or selection
statistics, with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; an out-of-memory run is recorded as such
so the other variants still run, and a variant's job ends with the script (`recipe.launch.end_with_parent`).
Every step is logged; tok/s is the tokens over the time of the steps after
the first `WARMUP_STEPS` (torchtitan's per-step tok/s, combined as total tokens over total time), and peak
reserved memory is torchtitan's own.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from lighthouse import LighthouseAttention, causal_attention
from recipe.errors import ALLOCATION_FAILURES, ConfigError
from recipe.launch import end_with_parent, single_process_env
from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.logs.run_logs import LOSS_TAG, MEMORY_TAG, TPS_TAG
from recipe.logs.run_record import REPO

DEFAULT_CONFIG = REPO / "configs" / "paper" / "stage1_L3_p4_k1536_norm.toml"
# What a variant's attention may be set to, as both `[lighthouse] backend` and `dense_backend`.
BACKENDS = ("cudnn", "flash_attn", "auto")
# Steps not timed. Under torch.compile the second step is still a warm-up: on an H100 at 8K tokens it ran at
# 14-18K tok/s against 42-95K for the steps after it, and timing it understated both variants, Lighthouse most.
WARMUP_STEPS = 2
OOM_LINE = "error: out of memory"  # how recipe.train.trainer reports one
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", OOM_LINE, *ALLOCATION_FAILURES[1:])
# The trainer refuses a setting with exit code 2; torchrun then exits 1 and names the rank's exit code.
REFUSED = re.compile(r"exitcode\s*:\s*2\b")


def switch_values(flag: str, text: str) -> list[bool]:
    """The settings of an on/off switch given as comma-separated `off`, `on` ("off,on": both); ValueError with
    the usage message naming `flag` and its value otherwise."""
    values = text.split(",")
    if not set(values) <= {"off", "on"}:
        raise ValueError(f"{flag}={text!r}: comma-separated values of off, on")
    return [value == "on" for value in values]


def too_few_steps(steps: int, warmup: int = WARMUP_STEPS) -> str | None:
    """Why `steps` per variant leave no timed step after `warmup` (a message naming the value), or None."""
    if steps <= warmup:
        return f"--steps={steps}: at least {warmup + 1} (the first {warmup} steps are not timed)"
    return None


def job_args(config: str, seq_len: int, steps: int, lighthouse: bool, ac: str, compile_on: bool,
             folder: Path, colocate: bool = False) -> list[str]:
    """Job arguments of one variant: only the attention, the checkpointing mode, compile and the host
    threads' placement (`[host] colocate_autograd`) differ."""
    return [
        "--job.config_file", config, "--job.dump_folder", str(folder), "--model.name", "llama3_lighthouse",
        "--training.seq_len", str(seq_len), "--training.steps", str(steps),
        "--training.local_batch_size", "1", "--training.global_batch_size", "1",
        "--training.dataset", "synthetic", "--checkpoint.no-enable", "--metrics.log_freq", "1",
        "--metrics.no-enable-tensorboard", "--metrics.no-enable-wandb", "--lighthouse.no-log-stats",
        *(["--compile.enable", "--compile.components", "model"] if compile_on else ["--compile.no-enable"]),
        "--activation_checkpoint.mode", ac, "--lighthouse.enable" if lighthouse else "--lighthouse.no-enable",
        "--host.colocate_autograd" if colocate else "--host.no-colocate-autograd",
    ]


def run_job(command: list[str], env: dict[str, str], timeout_s: float | None = None) -> tuple[int | None, str]:
    """Run a training job (its own session, ended with the script) from the repository root: (exit code, or
    None when it ran past `timeout_s` and was ended, with every process it started; stdout and stderr)."""
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=end_with_parent, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun and its workers
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        return None, output


def run_variant(argv: list[str], folder: Path, steps: int, nproc: int = 1, entry: Path = REPO / "train.py",
                timeout_s: float | None = None, warmup: int = WARMUP_STEPS) -> dict:
    """Train one variant in its own job (`entry` with `argv`, on `nproc` processes through torchrun); rank 0's
    throughput over the logged steps after the first `warmup` (torchtitan's, per rank; None when no step
    is left), its last step's memory and every step's loss, or the error: {"error": "out of memory"} (with
    the job's own line where it printed one) or {"error": "timeout"} past `timeout_s`. A setting the trainer
    refuses raises ConfigError with the trainer's line (every variant would meet it); any other failure raises
    RuntimeError."""
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    if nproc == 1:
        launcher = [sys.executable]
        env.update(single_process_env())
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    code, output = run_job([*launcher, str(entry), *argv], env, timeout_s)
    (folder / "train.log").write_text(output)
    if code is None:
        return {"error": "timeout", "timeout_s": timeout_s}
    if code != 0:
        if any(marker in output for marker in OOM_MARKERS):
            lines = [line for line in output.splitlines() if line.startswith(OOM_LINE)]
            return {"error": "out of memory", **({"line": lines[0]} if lines else {})}
        refusals = [line.removeprefix("error: ") for line in output.splitlines() if line.startswith("error: ")]
        if refusals and (code == 2 or REFUSED.search(output)):
            raise ConfigError(refusals[0])
        raise RuntimeError(f"training failed (exit {code}):\n{output[-4000:]}")
    rows = read_metrics(str(folder / METRICS_FILE))
    last = rows[-1]
    if last["step"] != steps:
        raise RuntimeError(f"expected a logged step {steps}, the last logged step is {last['step']}")
    per_step = [row[TPS_TAG] for row in rows[warmup:]]  # a resumed job's first steps are its warm-up too
    return {
        "tok_s": len(per_step) / sum(1 / tps for tps in per_step) if per_step else None,  # total tokens over time
        "tok_s_per_step": [row[TPS_TAG] for row in rows],
        "warmup_steps": warmup,
        "loss_per_step": [row.get(LOSS_TAG) for row in rows],
        "peak_gib": last[MEMORY_TAG],
        "peak_active_gib": last["memory/max_active(GiB)"],
        "tflops": last["tflops"],
        "process_s": time.perf_counter() - start,
    }


def amdahl(dense_tok_s: float | None, lighthouse_tok_s: float | None, tokens_per_step: int, n_lighthouse: int,
           times: dict[str, float], ac: str) -> dict:
    """Per-layer speedup and what it allows for the whole step (full checkpointing repeats the forward)."""
    def per_layer(name: str) -> float:
        return times[f"{name}_fwd_bwd_s"] + (times[f"{name}_fwd_s"] if ac == "full" else 0.0)

    dense_layer, lighthouse_layer = per_layer("dense"), per_layer("lighthouse")
    out = {"lighthouse_layer_speedup": dense_layer / lighthouse_layer, "lighthouse_layers": n_lighthouse,
           "dense_attention_layer_s": dense_layer, "lighthouse_attention_layer_s": lighthouse_layer}
    if dense_tok_s:
        dense_step = tokens_per_step / dense_tok_s
        share = n_lighthouse * dense_layer / dense_step
        out["lighthouse_layers_attention_share_of_dense_step"] = share
        out["amdahl_ceiling"] = 1 / (1 - share) if share < 1 else None
        out["predicted_speedup"] = dense_step / (dense_step - n_lighthouse * (dense_layer - lighthouse_layer))
        if lighthouse_tok_s:
            out["speedup"] = lighthouse_tok_s / dense_tok_s
    return out


def fmt(x: float | None, spec: str) -> str:
    """`x` formatted by `spec`, or "-" for a value not measured."""
    return "-" if x is None else format(x, spec)


def median_seconds(fn, device: torch.device, warmup: int = 2, reps: int = 7) -> float:
    """Median wall time of fn() in seconds (device-synchronised)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def attention_times(model_args, config, seq_len: int, device: torch.device, backend: str | None = None
                    ) -> dict[str, float]:
    """Seconds of one attention call, Lighthouse (as the model runs it) and dense causal attention, fwd and
    fwd + bwd; both on `backend` where given (else the config's, and SDPA's `auto` for dense)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    heads, kv_heads = model_args.n_heads, model_args.n_kv_heads or model_args.n_heads
    head_dim = model_args.dim // heads
    q = torch.randn(1, seq_len, heads, head_dim, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, seq_len, kv_heads, head_dim, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2))
    grad = torch.randn_like(q)
    if backend:
        config = dataclasses.replace(config, backend=backend)
    calls = {"lighthouse": LighthouseAttention(config),
             "dense": lambda a, b, c: causal_attention(a, b, c, backend or "auto")}
    times = {}
    for name, call in calls.items():
        def forward():
            with torch.no_grad():
                call(q, k, v)

        def forward_backward():
            torch.autograd.grad(call(q, k, v), (q, k, v), grad)

        times[f"{name}_fwd_s"] = median_seconds(forward, device)
        times[f"{name}_fwd_bwd_s"] = median_seconds(forward_backward, device)
    return times
