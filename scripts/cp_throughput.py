"""Per-rank training throughput under context parallelism: CP degree W against W = 1 at equal tokens per
rank, Lighthouse against dense at the same geometry.

    python scripts/cp_throughput.py --json docs/cp_throughput.json --plot docs/cp_throughput.png   # 2 GPUs
    python scripts/cp_throughput.py --config configs/debug.toml --tokens-per-rank 512 --steps 3 \\
        --topk 64 --ac none                                                        # CPU smoke run, gloo
    python scripts/cp_throughput.py --records docs/cp_throughput.json --plot docs/cp_throughput.png   # replot
    python scripts/cp_throughput.py --cp 1,4 --topk 2048 --attentions lighthouse -- --lighthouse.dense_layers
        # every layer Lighthouse: arguments after -- go to train.py

For every degree W in `--cp` and each attention, trains the config (default: the paper's L=3, p=4, k=1536
stage 1, full activation checkpointing; its 12 tiles split over 2W chunks for W = 1, 2, 3, 6) on W
processes with `parallelism.context_parallel_degree = W` and `seq_len = W * --tokens-per-rank`, so every
rank holds the same number of tokens. Everything else as `train_throughput.py` (local batch 1, synthetic
data, no checkpoints, no compile, each variant its own job), without selection statistics (an extra
selection pass on the timed last step). torchtitan's tok/s is per rank (tokens of the step / (time * CP degree)).
Reports, per W: tok/s per rank, the share of the W = 1 throughput kept, and the Lighthouse speedup over
dense.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from train_throughput import DEFAULT_CONFIG, REPO, environment, fmt, job_args, run_variant

import torch  # noqa: E402  (after train_throughput, which imports the recipe before torchtitan)

ATTENTIONS = ("lighthouse", "dense")


def variant_args(args: argparse.Namespace, cp: int, attention: str, folder: Path) -> list[str]:
    """train.py arguments of one (CP degree, attention) variant; `args.train_args` last, so they win."""
    argv = job_args(args.config, cp * args.tokens_per_rank, args.steps, attention == "lighthouse", args.ac, folder)
    argv += ["--parallelism.context_parallel_degree", str(cp), "--parallelism.data_parallel_shard_degree", "1",
             "--lighthouse.no-log-stats"]
    argv += ["--lighthouse.topk", str(args.topk)] if args.topk else []
    return argv + args.train_args


def summarize(runs: dict[tuple[int, str], dict], degrees: list[int]) -> list[dict]:
    """One record per CP degree: per-rank tok/s and memory of each attention (None where not run or
    failed), the share of the degree-1 throughput kept, and the Lighthouse speedup over dense."""
    records = []
    for cp in degrees:
        record = {"cp_degree": cp}
        for attention in ATTENTIONS:
            run, base = runs.get((cp, attention), {}), runs.get((1, attention), {})
            record[f"{attention}_tok_s_per_rank"] = run.get("tok_s")
            record[f"{attention}_peak_gib"] = run.get("peak_gib")
            kept = run.get("tok_s") and base.get("tok_s") and run["tok_s"] / base["tok_s"]
            record[f"{attention}_kept_of_cp1"] = kept or None
        lh, dense = record["lighthouse_tok_s_per_rank"], record["dense_tok_s_per_rank"]
        record["lighthouse_speedup"] = lh / dense if lh and dense else None
        record["runs"] = {attention: runs[cp, attention] for attention in ATTENTIONS if (cp, attention) in runs}
        records.append(record)
    return records


def describe(record: dict) -> str:
    """The config file, with the topk override and extra train.py arguments if any."""
    override, extra = record.get("topk_override"), record.get("train_args")
    return (record["config"] + (f" with lighthouse.topk={override}" if override else "")
            + (f" {' '.join(extra)}" if extra else ""))


def table(records: list[dict]) -> str:
    lines = ["| CP degree | seq len | Lighthouse tok/s per rank | kept of CP=1 | dense tok/s per rank | kept of CP=1 "
             "| Lighthouse speedup | Lighthouse / dense peak GiB |", "| --- " * 8 + "|"]
    for r in records:
        lines.append(
            f"| {r['cp_degree']} | {r['seq_len']:,} | {fmt(r['lighthouse_tok_s_per_rank'], ',.0f')} | "
            f"{fmt(r['lighthouse_kept_of_cp1'], '.0%')} | {fmt(r['dense_tok_s_per_rank'], ',.0f')} | "
            f"{fmt(r['dense_kept_of_cp1'], '.0%')} | {fmt(r['lighthouse_speedup'], '.2f')} | "
            f"{fmt(r['lighthouse_peak_gib'], '.1f')} / {fmt(r['dense_peak_gib'], '.1f')} |"
        )
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    """Bars of per-rank tok/s of each attention run, per CP degree; the card in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    shown = [a for a in ATTENTIONS if any(r[f"{a}_tok_s_per_rank"] for r in records)]
    width = 0.76 / len(shown)
    for i, attention in enumerate(shown):
        xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(records))]
        ys = [r[f"{attention}_tok_s_per_rank"] or 0 for r in records]
        bars = ax.bar(xs, ys, width, label=attention)
        ax.bar_label(bars, labels=[fmt(r[f"{attention}_kept_of_cp1"], ".0%") for r in records], fontsize=8)
    ax.set_xticks(range(len(records)), [f"CP={r['cp_degree']}\nN={r['seq_len']:,}" for r in records])
    ax.set_ylabel("tok/s per rank")
    env = records[0]["environment"]
    ax.set_title(f"{env['device']}, {records[0]['tokens_per_rank']:,} tokens per rank\n{describe(records[0])}\n"
                 "(bar labels: share of the CP=1 tok/s kept)", fontsize=8)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--tokens-per-rank", type=int, default=49152,
                        help="the default makes CP=2 the paper's stage-1 length, 98,304")
    parser.add_argument("--cp", default="1,2", help="CP degrees, comma-separated; 1 is the baseline")
    parser.add_argument("--steps", type=int, default=6, help="steps per variant; all after the first are timed")
    parser.add_argument("--ac", default="full", choices=("none", "selective", "full"))
    parser.add_argument("--topk", type=int,
                        help="override lighthouse.topk (topk/tile_budget must split over 2W chunks)")
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    parser.add_argument("--records", type=Path, help="read records from this JSON instead of training")
    parser.add_argument("--attentions", default=",".join(ATTENTIONS), help="comma-separated subset of "
                        f"{ATTENTIONS}")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: train.py arguments for every variant")
    args = parser.parse_args(argv)
    args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args

    if args.records:
        records = json.loads(args.records.read_text())
    else:
        degrees = sorted({int(x) for x in args.cp.split(",")})
        if 1 not in degrees:
            raise SystemExit(f"--cp={args.cp}: include 1, the baseline every degree is compared with")
        if args.steps < 2:
            raise SystemExit(f"--steps={args.steps}: at least 2 (the first step is not timed)")
        attentions = args.attentions.split(",")
        if not set(attentions) <= set(ATTENTIONS):
            raise SystemExit(f"--attentions={args.attentions}: choose from {ATTENTIONS}")
        runs: dict[tuple[int, str], dict] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for cp in degrees:
                for attention in attentions:
                    folder = Path(tmp) / f"{attention}_cp{cp}"
                    runs[cp, attention] = run_variant(variant_args(args, cp, attention, folder), folder, args.steps, cp)
                    print(f"cp={cp} {attention:10s} {runs[cp, attention]}", flush=True)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        config_path = Path(args.config).resolve()
        shown = config_path.relative_to(REPO) if config_path.is_relative_to(REPO) else config_path
        common = {"config": str(shown), "tokens_per_rank": args.tokens_per_rank, "activation_checkpointing": args.ac,
                  "topk_override": args.topk, "train_args": args.train_args,
                  "steps": args.steps, "environment": environment(device)}
        records = [{**r, "seq_len": r["cp_degree"] * args.tokens_per_rank, **common} for r in summarize(runs, degrees)]

    first = records[0]
    print(f"\n{describe(first)}, {first['tokens_per_rank']:,} tokens per rank, batch 1, "
          f"activation checkpointing {first['activation_checkpointing']}, {first['steps']} steps (first not timed)")
    print(" | ".join(f"{k} {v}" for k, v in first["environment"].items()))
    print(table(records))
    if args.json and not args.records:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    if args.plot:
        plot(records, args.plot)
    return records


if __name__ == "__main__":
    main()
