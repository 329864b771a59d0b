"""Per-rank training throughput under context parallelism (scripts/cp_throughput.py): CP degree W against
W = 1 at equal tokens per rank, Lighthouse against dense at the same geometry.

Each (W, attention) variant trains on W processes with `parallelism.context_parallel_degree = W` and
`seq_len = W * tokens_per_rank`, otherwise as `eval.throughput` runs a variant (torch.compile of the model
where the job says so).
torchtitan's tok/s is per rank (tokens of the step / (time * CP degree)).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from eval.device import pick_device
from eval.records import environment
from eval.throughput import WARMUP_STEPS, fmt, job_args, run_variant
from recipe.run_record import REPO

ATTENTIONS = ("lighthouse", "dense")


@dataclass(frozen=True)
class CpThroughputJob:
    """What every variant shares: the config, tokens per rank, steps, checkpointing, a topk override, compile
    and more train.py arguments (last, so they win)."""

    config: str
    tokens_per_rank: int
    steps: int
    ac: str
    topk: int | None = None
    compile: bool = False
    train_args: list[str] = field(default_factory=list)


def variant_args(job: CpThroughputJob, cp: int, attention: str, folder: Path) -> list[str]:
    """train.py arguments of one (CP degree, attention) variant."""
    argv = job_args(job.config, cp * job.tokens_per_rank, job.steps, attention == "lighthouse", job.ac, job.compile, folder)
    argv += ["--parallelism.context_parallel_degree", str(cp), "--parallelism.data_parallel_shard_degree", "1"]
    argv += ["--lighthouse.topk", str(job.topk)] if job.topk else []
    return argv + job.train_args


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


def measure(job: CpThroughputJob, degrees: list[int], attentions: list[str]) -> list[dict]:
    """Train every (degree, attention) variant, printing each run as it ends (a failed one as its error); the
    records of `summarize` with the sequence length and what the variants shared."""
    runs: dict[tuple[int, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cp in degrees:
            for attention in attentions:
                folder = Path(tmp) / f"{attention}_cp{cp}"
                try:
                    runs[cp, attention] = run_variant(variant_args(job, cp, attention, folder), folder, job.steps, cp)
                except RuntimeError as err:  # one failed variant is a gap in the records, not a lost sweep
                    runs[cp, attention] = {"error": str(err)}
                print(f"cp={cp} {attention:10s} {runs[cp, attention]}", flush=True)
    config_path = Path(job.config).resolve()
    shown = config_path.relative_to(REPO) if config_path.is_relative_to(REPO) else config_path
    common = {"config": str(shown), "tokens_per_rank": job.tokens_per_rank, "activation_checkpointing": job.ac,
              "compile": job.compile, "topk_override": job.topk, "train_args": job.train_args,
              "steps": job.steps, "environment": environment(pick_device("auto"))}
    return [{**r, "seq_len": r["cp_degree"] * job.tokens_per_rank, **common} for r in summarize(runs, degrees)]


def describe(record: dict) -> str:
    """The config file, with the topk override and extra train.py arguments if any."""
    override, extra = record.get("topk_override"), record.get("train_args")
    return (record["config"] + (f" with lighthouse.topk={override}" if override else "")
            + (f" {' '.join(extra)}" if extra else ""))


def table(records: list[dict]) -> str:
    """The markdown table: per degree, tok/s per rank and share kept of each attention, speedup, memory."""
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


def report(records: list[dict]) -> str:
    """What the variants shared, the environment line and the table."""
    first = records[0]
    return (f"\n{describe(first)}, {first['tokens_per_rank']:,} tokens per rank, batch 1, "
            f"activation checkpointing {first['activation_checkpointing']}, "
            f"compile {'on' if first.get('compile') else 'off'}, {first['steps']} steps (first {WARMUP_STEPS} not timed)\n"
            + " | ".join(f"{k} {v}" for k, v in first["environment"].items()) + "\n" + table(records))


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
    compiled = "compiled" if records[0].get("compile") else "eager"
    ax.set_title(f"{env['device']}, {records[0]['tokens_per_rank']:,} tokens per rank, {compiled}\n{describe(records[0])}\n"
                 "(bar labels: share of the CP=1 tok/s kept)", fontsize=8)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
