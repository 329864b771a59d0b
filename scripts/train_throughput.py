"""Training throughput and peak memory of one config with Lighthouse and with dense SDPA, same device, same run.

Runs the real trainer (train.py) twice, each in a fresh process on one device, local batch 1, synthetic data,
no checkpoints, and reads torchtitan's own metrics from each run's metrics.jsonl:

    python scripts/train_throughput.py --seq-len 98304 --steps 12            # the paper model, one GPU
    python scripts/train_throughput.py --config configs/debug.toml --seq-len 512 --steps 4   # CPU smoke run

Prints a markdown table (tok/s per device = torchtitan's throughput(tps) averaged over the steps after
`--warmup`; TFLOP/s by the recipe's FLOP convention; peak active and reserved memory) with a header of
device, CUDA, torch and torchtitan versions and the git commit, and writes the same as JSON with `--json`.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from recipe.metrics import METRICS_FILE, read_metrics  # noqa: E402
from recipe.paper_configs import CONFIG_DIR, HEADLINE  # noqa: E402


def run_variant(config: str, seq_len: int, steps: int, lighthouse: bool, folder: Path) -> list[dict]:
    """One training run in its own process (so each starts with an empty allocator); its per-step metrics."""
    argv = [
        sys.executable, "train.py", "--job.config_file", config, "--job.dump_folder", str(folder),
        "--training.seq_len", str(seq_len), "--training.steps", str(steps),
        "--training.local_batch_size", "1", "--training.global_batch_size", "1",
        "--training.dataset", "synthetic", "--checkpoint.no-enable", "--metrics.log_freq", "1",
        "--metrics.no-enable-tensorboard", "--metrics.no-enable-wandb",
        "--lighthouse.enable" if lighthouse else "--lighthouse.no-enable",
    ]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"training run failed ({' '.join(argv[1:])}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return read_metrics(str(folder / METRICS_FILE))


def summarize(records: list[dict], warmup: int) -> dict[str, float]:
    timed = [r for r in records if r["step"] > warmup]
    if not timed:
        raise ValueError(f"--steps must exceed --warmup={warmup}: no timed step left")
    return {
        "tok_per_s": statistics.mean(r["throughput(tps)"] for r in timed),
        "tflops": statistics.mean(r["tflops"] for r in timed),
        "peak_active_gib": max(r["memory/max_active(GiB)"] for r in timed),
        "peak_reserved_gib": max(r["memory/max_reserved(GiB)"] for r in timed),
        "final_loss": timed[-1]["loss_metrics/global_avg_loss"],
    }


def environment() -> dict[str, str]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU {platform.machine()}"
    return {
        "device": device,
        "cuda": str(torch.version.cuda),
        "torch": torch.__version__,
        "torchtitan": version("torchtitan"),
        "commit": commit.stdout.strip() or "unknown",
    }


def main_cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(CONFIG_DIR / f"{HEADLINE.name}.toml"))
    parser.add_argument("--seq-len", type=int, default=98304)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the averages")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, lighthouse in (("lighthouse", True), ("dense", False)):
            records = run_variant(args.config, args.seq_len, args.steps, lighthouse, Path(tmp) / name)
            results[name] = summarize(records, args.warmup)

    env = environment()
    print(f"\n{Path(args.config).name}, seq_len {args.seq_len}, local batch 1, {args.steps} steps "
          f"(first {args.warmup} not averaged)")
    print(" | ".join(f"{k} {v}" for k, v in env.items()))
    print("\n| attention | tok/s | TFLOP/s | peak active GiB | peak reserved GiB | loss at last step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['tok_per_s']:,.0f} | {r['tflops']:.1f} | {r['peak_active_gib']:.2f} | "
              f"{r['peak_reserved_gib']:.2f} | {r['final_loss']:.4f} |")
    speedup = results["lighthouse"]["tok_per_s"] / results["dense"]["tok_per_s"]
    print(f"\nLighthouse / dense throughput: {speedup:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "config": args.config, "seq_len": args.seq_len,
                                         "steps": args.steps, "warmup": args.warmup, "results": results}, indent=2))


if __name__ == "__main__":
    main_cli()
