"""Stage-1 training throughput and peak memory of one model with Lighthouse and with dense SDPA, one device.

    python scripts/train_throughput.py --json docs/train_throughput.json          # the paper model, seq 98,304
    python scripts/train_throughput.py --config configs/debug.toml --seq-len 512 --steps 3   # CPU smoke run

For each activation-checkpointing mode (`--ac none,full`), trains the config (default: the paper's
L=3, p=4, k=1536 norm-scorer stage 1) with Lighthouse on the fused kernels and with dense attention (cuDNN
SDPA on CUDA), same settings otherwise: local batch 1, synthetic data, no checkpoints, no compile,
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`. Each variant is its own process (an out-of-memory run
is recorded as such and the others still run). tok/s and peak reserved memory are torchtitan's own,
logged at the last step over every step after the first (Lighthouse statistics are collected on that
last step only).

Then it times one attention call of the model's shape (B 1, the model's heads and head dim) with the
Lighthouse call the model used and with dense SDPA, forward and forward + backward, and turns that into
the Amdahl view: the share of the dense step spent in the attention of the layers that run Lighthouse,
the whole-model ceiling if that attention cost nothing, and the speedup predicted from the per-layer
speedup. Prints markdown tables; `--json` writes one record per checkpointing mode.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import recipe  # noqa: E402,F401  (before torchtitan)
import models  # noqa: E402,F401  (registers the llama3_lighthouse TrainSpec)
import torch  # noqa: E402
import torchtitan  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.protocols.train_spec import get_train_spec  # noqa: E402

from lighthouse import LighthouseAttention, causal_attention  # noqa: E402
from recipe.launch import single_process_env  # noqa: E402
from recipe.metrics import METRICS_FILE, read_metrics  # noqa: E402
from source_commit import source_commit  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "paper" / "stage1_L3_p4_k1536_norm.toml"
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")


def job_args(config: str, seq_len: int, steps: int, lighthouse: bool, ac: str, folder: Path) -> list[str]:
    """Job arguments of one variant: only the attention and the checkpointing mode differ between variants."""
    return [
        "--job.config_file", config, "--job.dump_folder", str(folder), "--model.name", "llama3_lighthouse",
        "--training.seq_len", str(seq_len), "--training.steps", str(steps),
        "--training.local_batch_size", "1", "--training.global_batch_size", "1",
        "--training.dataset", "synthetic", "--checkpoint.no-enable", "--metrics.log_freq", str(steps),
        "--metrics.no-enable-tensorboard", "--metrics.no-enable-wandb", "--compile.no-enable",
        "--activation_checkpoint.mode", ac, "--lighthouse.enable" if lighthouse else "--lighthouse.no-enable",
    ]


def run_variant(argv: list[str], folder: Path, steps: int, nproc: int = 1) -> dict:
    """Train one variant in its own job (`nproc` processes through torchrun); rank 0's last logged step's
    throughput (torchtitan's, per rank) and memory, or the error."""
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    if nproc == 1:
        launcher = [sys.executable]
        env.update(single_process_env())
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    proc = subprocess.run([*launcher, str(REPO / "train.py"), *argv], cwd=REPO, env=env,
                          capture_output=True, text=True)
    (folder / "train.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        if any(marker in proc.stdout + proc.stderr for marker in OOM_MARKERS):
            return {"error": "out of memory"}
        raise RuntimeError(f"training failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    last = read_metrics(str(folder / METRICS_FILE))[-1]
    if last["step"] != steps:
        raise RuntimeError(f"expected a logged step {steps}, the last logged step is {last['step']}")
    return {
        "tok_s": last["throughput(tps)"],
        "peak_gib": last["memory/max_reserved(GiB)"],
        "peak_active_gib": last["memory/max_active(GiB)"],
        "tflops": last["tflops"],
        "process_s": time.perf_counter() - start,
    }


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


def attention_times(model_args, config, seq_len: int, device: torch.device) -> dict[str, float]:
    """Seconds of one attention call, Lighthouse (as the model runs it) and dense SDPA, fwd and fwd + bwd."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    heads, kv_heads = model_args.n_heads, model_args.n_kv_heads or model_args.n_heads
    head_dim = model_args.dim // heads
    q = torch.randn(1, seq_len, heads, head_dim, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, seq_len, kv_heads, head_dim, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2))
    grad = torch.randn_like(q)
    calls = {"lighthouse": LighthouseAttention(config), "dense": lambda a, b, c: causal_attention(a, b, c)}
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


def environment(device: torch.device) -> dict[str, str]:
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"CPU {platform.machine()}",
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()) if device.type == "cuda" else "none",
        "torch": torch.__version__,
        "torchtitan": torchtitan.__version__,
        "commit": source_commit(REPO),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--seq-len", type=int, default=98304)
    parser.add_argument("--steps", type=int, default=7, help="steps per variant; all after the first are timed")
    parser.add_argument("--ac", default="none,full", help="activation checkpointing modes, comma-separated")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    if args.steps < 2:
        raise SystemExit(f"--steps={args.steps}: at least 2 (the first step is not timed)")
    modes = args.ac.split(",")

    job = ConfigManager().parse_args(["--job.config_file", args.config, "--training.seq_len", str(args.seq_len)])
    spec = get_train_spec("llama3_lighthouse")
    model_args = copy.deepcopy(spec.model_args[job.model.flavor])
    model_args.update_from_config(job)
    n_lighthouse = len([i for i in range(model_args.n_layers) if i not in job.lighthouse.dense_layers])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    runs: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ac in modes:
            for name in ("lighthouse", "dense"):
                folder = Path(tmp) / f"{name}_{ac}"
                argv_variant = job_args(args.config, args.seq_len, args.steps, name == "lighthouse", ac, folder)
                runs[name, ac] = run_variant(argv_variant, folder, args.steps)
                print(f"{name:10s} ac={ac:4s} {runs[name, ac]}", flush=True)
    times = attention_times(model_args, job.lighthouse.to_config(), args.seq_len, device)

    env = environment(device)
    config_path = Path(args.config).resolve()
    shown = config_path.relative_to(REPO) if config_path.is_relative_to(REPO) else config_path
    model = (f"{shown} ({job.model.flavor}: d {model_args.dim}, {model_args.n_layers} layers, "
             f"{model_args.n_heads} heads; dense layers {list(job.lighthouse.dense_layers)}; "
             f"L={job.lighthouse.levels} p={job.lighthouse.pool} k={job.lighthouse.topk} {job.lighthouse.scorer})")
    records = []
    for ac in modes:
        lh, dense = runs["lighthouse", ac], runs["dense", ac]
        records.append({
            "device": env["device"], "seq_len": args.seq_len, "model": model, "activation_checkpointing": ac,
            "lighthouse_tok_s": lh.get("tok_s"), "dense_tok_s": dense.get("tok_s"),
            "lighthouse_peak_gib": lh.get("peak_gib"), "dense_peak_gib": dense.get("peak_gib"),
            **amdahl(dense.get("tok_s"), lh.get("tok_s"), args.seq_len, n_lighthouse, times, ac),
            "runs": {"lighthouse": lh, "dense": dense}, "attention_call_s": times, "steps": args.steps,
            "environment": env,
        })

    print(f"\n{model}\nseq_len {args.seq_len}, batch 1, {args.steps} steps (first not timed), compile off")
    print(" | ".join(f"{k} {v}" for k, v in env.items()))
    print("\n| activation checkpointing | Lighthouse tok/s | dense tok/s | speedup | Lighthouse peak GiB | "
          "dense peak GiB | per-layer attention speedup | Amdahl ceiling | predicted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in records:
        print(f"| {r['activation_checkpointing']} | {fmt(r['lighthouse_tok_s'], ',.0f')} | "
              f"{fmt(r['dense_tok_s'], ',.0f')} | {fmt(r.get('speedup'), '.2f')} | "
              f"{fmt(r['lighthouse_peak_gib'], '.1f')} | {fmt(r['dense_peak_gib'], '.1f')} | "
              f"{r['lighthouse_layer_speedup']:.2f} | {fmt(r.get('amdahl_ceiling'), '.2f')} | "
              f"{fmt(r.get('predicted_speedup'), '.2f')} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    return records


if __name__ == "__main__":
    main()
