"""Per-rank training throughput under context parallelism (scripts/cp_throughput.py): Lighthouse against dense
at the same geometry, eager and compiled, with `dense_layers` variants, CP degree W against W = 1 at equal
tokens per rank, where the step's time goes (per-block timing), and a dense stage 2 resumed from a stage-1
checkpoint.

Each variant (CP degree, attention, compile, the Lighthouse model's dense layers) trains on W processes with
`parallelism.context_parallel_degree = W` and `seq_len = W * tokens_per_rank`, otherwise as `eval.benchmarks.throughput`
runs a variant; with `layer_times` it runs scripts/train_layer_times.py in place of train.py
(`eval.benchmarks.layer_times`). torchtitan's tok/s is per rank (tokens of the step / (time * CP degree)).
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from eval.benchmarks.layer_times import LAYER_TIMES_FILE, summarize_layer_times
from eval.benchmarks.throughput import WARMUP_STEPS, fmt, job_args, run_variant
from eval.device import pick_device
from eval.records import command_line, environment, shown_path
from recipe.logs.run_record import REPO

ATTENTIONS = ("lighthouse", "dense")
LAYER_TIMES_ENTRY = REPO / "scripts" / "train_layer_times.py"
# What a record's variants shared: a resumed measurement (`--resume`) must share them too.
SHARED = ("config", "tokens_per_rank", "activation_checkpointing", "topk_override", "train_args", "layer_times")
# What `report` and `plot` read of every record (the first one's settings and environment, whose card and commit
# title the plot; each one's numbers).
REPORT_KEYS = ("config", "tokens_per_rank", "activation_checkpointing", "steps", "environment.device",
               "environment.commit", "cp_degree", "seq_len",
               "lighthouse_tok_s_per_rank", "lighthouse_kept_of_cp1", "lighthouse_peak_gib", "dense_tok_s_per_rank",
               "dense_kept_of_cp1", "dense_peak_gib", "lighthouse_speedup", "runs")
# What they read of a run's objects, where it holds them (`run_keys`): the command of the call that measured it
# (any run), and where a Lighthouse step went (`layer_times_table`; the plot's bars are three of them).
MEASURED_BY_KEYS = ("command",)
LAYER_TIMES_KEYS = ("dense_layers", "step_s", "dense_s", "dense_share", "dense_forward_s", "dense_backward_s",
                    "lighthouse_s", "lighthouse_share", "lighthouse_forward_s", "lighthouse_backward_s", "rest_s",
                    "rest_share")


@dataclass(frozen=True)
class Variant:
    """One training job: CP degree, attention, compile, and the dense layers of a Lighthouse model (None: the
    config's; dense runs every layer dense, so its variant has None)."""

    cp: int
    attention: str
    compile: bool
    dense_layers: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        layers = "" if self.dense_layers is None else "_dense-" + ("-".join(map(str, self.dense_layers)) or "none")
        return f"{self.attention}_cp{self.cp}_{'compiled' if self.compile else 'eager'}{layers}"


@dataclass(frozen=True)
class CpThroughputJob:
    """What every variant shares: the config, tokens per rank, steps, checkpointing, a topk override, the compile
    settings and dense-layer sets to run, per-block timing, more train.py arguments (last, so they win) and
    the steps not timed. Steps and warm-up may differ between the runs of one record (each run says its own)."""

    config: str
    tokens_per_rank: int
    steps: int
    ac: str
    topk: int | None = None
    compile_modes: tuple[bool, ...] = (False,)
    dense_layer_sets: tuple[tuple[int, ...] | None, ...] = (None,)
    layer_times: bool = False
    train_args: list[str] = field(default_factory=list)
    warmup: int = WARMUP_STEPS


def variants(job: CpThroughputJob, degrees: list[int], attentions: list[str]) -> list[Variant]:
    """Every variant to train, in order: per degree and compile setting, Lighthouse with each dense-layer set,
    then dense once."""
    out = []
    for cp in degrees:
        for compile_on in job.compile_modes:
            for attention in attentions:
                sets = job.dense_layer_sets if attention == "lighthouse" else (None,)
                out += [Variant(cp, attention, compile_on, layers) for layers in sets]
    return out


def variant_args(job: CpThroughputJob, variant: Variant, folder: Path) -> list[str]:
    """train.py arguments of one variant."""
    argv = job_args(job.config, variant.cp * job.tokens_per_rank, job.steps, variant.attention == "lighthouse",
                    job.ac, variant.compile, folder)
    argv += ["--parallelism.context_parallel_degree", str(variant.cp), "--parallelism.data_parallel_shard_degree", "1"]
    argv += ["--lighthouse.topk", str(job.topk)] if job.topk else []
    argv += [] if variant.dense_layers is None else ["--lighthouse.dense_layers", *map(str, variant.dense_layers)]
    return argv + job.train_args


def summarize(runs: dict[Variant, dict], degrees: list[int]) -> list[dict]:
    """One record per (CP degree, compile, dense-layer set) that ran: per-rank tok/s and memory of Lighthouse
    with those dense layers and of dense at that degree and compile setting (None where not run or failed), the
    share of the degree-1 throughput kept, and the Lighthouse speedup over dense."""
    groups = list(dict.fromkeys((v.cp, v.compile, v.dense_layers) for v in runs if v.attention == "lighthouse"))
    groups += [(v.cp, v.compile, None) for v in runs if v.attention == "dense"
               and not any(g[:2] == (v.cp, v.compile) for g in groups)]
    records = []
    for cp in degrees:
        for _, compile_on, layers in [g for g in groups if g[0] == cp]:
            record = {"cp_degree": cp, "compile": compile_on,
                      "dense_layers": None if layers is None else list(layers)}
            chosen = {attention: Variant(cp, attention, compile_on, layers if attention == "lighthouse" else None)
                      for attention in ATTENTIONS}
            for attention, variant in chosen.items():
                run = runs.get(variant, {})
                base = runs.get(Variant(1, attention, compile_on, variant.dense_layers), {})
                record[f"{attention}_tok_s_per_rank"] = run.get("tok_s")
                record[f"{attention}_peak_gib"] = run.get("peak_gib")
                kept = run.get("tok_s") and base.get("tok_s") and run["tok_s"] / base["tok_s"]
                record[f"{attention}_kept_of_cp1"] = kept or None
            lh, dense = record["lighthouse_tok_s_per_rank"], record["dense_tok_s_per_rank"]
            record["lighthouse_speedup"] = lh / dense if lh and dense else None
            record["runs"] = {attention: runs[variant] for attention, variant in chosen.items() if variant in runs}
            records.append(record)
    return records


def run_keys(runs: dict[str, dict]) -> dict[str, tuple[str, ...]]:
    """What `report` and `plot` read of a record's `runs` (an object of runs) beyond REPORT_KEYS: the dotted path
    below "runs" of each object they read -> the keys they read of it."""
    read = {f"{name}.measured_by": MEASURED_BY_KEYS for name, run in runs.items() if "measured_by" in run}
    if "layer_times" in runs.get("lighthouse", {}):
        read["lighthouse.layer_times"] = LAYER_TIMES_KEYS
    return read


def shared_settings(job: CpThroughputJob) -> dict:
    """The settings every record of `job` carries (what `--resume` compares)."""
    return {"config": shown_path(job.config), "tokens_per_rank": job.tokens_per_rank,
            "activation_checkpointing": job.ac, "topk_override": job.topk, "train_args": job.train_args,
            "layer_times": job.layer_times}


def measured_runs(records: list[dict], job: CpThroughputJob) -> dict[Variant, dict]:
    """The runs of earlier `records` that trained (errors are run again); ValueError naming the first setting
    in which they differ from `job`."""
    settings = shared_settings(job)
    runs: dict[Variant, dict] = {}
    for record in records:
        for key in SHARED:
            if record.get(key) != settings[key]:
                raise ValueError(f"the records were measured with {key}={record.get(key)!r}, this run has "
                                 f"{settings[key]!r}; resume with the same settings or write another --json")
        layers = None if record.get("dense_layers") is None else tuple(record["dense_layers"])
        for attention, run in record["runs"].items():
            variant = Variant(record["cp_degree"], attention, record["compile"],
                              layers if attention == "lighthouse" else None)
            if "error" not in run:
                runs[variant] = run
    return runs


def attempt(argv: list[str], folder: Path, steps: int, nproc: int, entry: Path = REPO / "train.py",
            timeout_s: float | None = None, warmup: int = WARMUP_STEPS) -> dict:
    """`run_variant`, a failure recorded as {"error": its message}: one failed variant is a gap in the records,
    not a lost sweep."""
    try:
        return run_variant(argv, folder, steps, nproc, entry, timeout_s, warmup)
    except RuntimeError as err:
        return {"error": str(err)}


def train(job: CpThroughputJob, variant: Variant, folder: Path) -> dict:
    """Train one variant; its run (with its per-block times under `layer_times`), or its error."""
    entry = LAYER_TIMES_ENTRY if job.layer_times else REPO / "train.py"
    run = attempt(variant_args(job, variant, folder), folder, job.steps, variant.cp, entry, warmup=job.warmup)
    if job.layer_times and "error" not in run:
        run["layer_times"] = summarize_layer_times(folder / LAYER_TIMES_FILE, job.warmup)
    return run


def measure(job: CpThroughputJob, degrees: list[int], attentions: list[str], done: dict[Variant, dict] | None = None,
            save: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Train every variant not in `done` (earlier runs, kept), printing each run as it ends (a failed one as
    its error) and handing the records so far to `save` after each; the records of `summarize` (of these
    degrees and those of `done`) with the sequence length and what the variants shared. Each run trained
    here names the command and environment that measured it (a resumed file mixes calls)."""
    runs: dict[Variant, dict] = dict(done or {})
    common = {**shared_settings(job), "steps": job.steps, "warmup_steps": job.warmup, "command": command_line(),
              "environment": environment(pick_device("auto"))}

    def records() -> list[dict]:  # earlier runs' degrees too: a split measurement keeps one file whole
        every = sorted(set(degrees) | {v.cp for v in runs})
        return [{**r, "seq_len": r["cp_degree"] * job.tokens_per_rank, **common} for r in summarize(runs, every)]

    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants(job, degrees, attentions):
            if variant in runs:
                print(f"{variant.name}: measured before, kept", flush=True)
                continue
            runs[variant] = {**train(job, variant, Path(tmp) / variant.name),
                             "measured_by": {key: common[key] for key in ("command", "environment")}}
            print(f"{variant.name} {runs[variant]}", flush=True)
            if save:
                save(records())
    return records()


def measure_stage2(job: CpThroughputJob, cp: int, stage2_steps: int) -> dict:
    """Stage 1 (Lighthouse, the first compile setting, `job.steps` steps, a full checkpoint at the last), then
    stage 2: dense, the same compile setting, resumed from that checkpoint with its whole state (model,
    optimizer, LR schedule, data position, step) for `stage2_steps` more steps; the record of both runs."""
    compile_on = job.compile_modes[0]
    stage1 = Variant(cp, "lighthouse", compile_on, job.dense_layer_sets[0])
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp) / "stage1", Path(tmp) / "stage2"
        save = ["--checkpoint.enable", "--checkpoint.folder", "checkpoint", "--checkpoint.interval", str(job.steps)]
        argv = variant_args(job, stage1, first) + save + ["--checkpoint.no-last-save-model-only"]
        runs = {"stage1": attempt(argv, first, job.steps, cp, warmup=job.warmup)}
        print(f"stage 1 {runs['stage1']}", flush=True)
        if "error" not in runs["stage1"]:
            total = job.steps + stage2_steps
            resume = ["--checkpoint.initial_load_path", str(first / "checkpoint" / f"step-{job.steps}"),
                      "--checkpoint.no-initial-load-model-only", "--training.steps", str(total)]
            runs["stage2"] = attempt(variant_args(job, Variant(cp, "dense", compile_on), second) + save + resume,
                                     second, total, cp, warmup=job.warmup)
            print(f"stage 2 {runs['stage2']}", flush=True)
    return {"cp_degree": cp, "seq_len": cp * job.tokens_per_rank, "compile": compile_on,
            "stage1_steps": job.steps, "stage2_steps": stage2_steps, "warmup_steps": job.warmup, "runs": runs,
            **shared_settings(job),
            "command": command_line(), "environment": environment(pick_device("auto"))}


def describe(record: dict) -> str:
    """The config file, with the topk override and extra train.py arguments if any."""
    override, extra = record.get("topk_override"), record.get("train_args")
    return (record["config"] + (f" with lighthouse.topk={override}" if override else "")
            + (f" {' '.join(extra)}" if extra else ""))


def mode(record: dict) -> str:
    return "compiled" if record.get("compile") else "eager"


def layers_label(record: dict) -> str:
    """The Lighthouse model's dense layers of a record: the config's, or the list it ran with."""
    layers = record.get("dense_layers")
    return "config's" if layers is None else (str(layers) if layers else "none")


def table(records: list[dict]) -> str:
    """The markdown table: per variant, tok/s per rank and share kept of each attention, speedup, memory."""
    lines = ["| CP degree | seq len | mode | Lighthouse dense layers | Lighthouse tok/s per rank | kept of CP=1 "
             "| dense tok/s per rank | kept of CP=1 | Lighthouse speedup | Lighthouse / dense peak GiB |",
             "| --- " * 10 + "|"]
    for r in records:
        lines.append(
            f"| {r['cp_degree']} | {r['seq_len']:,} | {mode(r)} | {layers_label(r)} | "
            f"{fmt(r['lighthouse_tok_s_per_rank'], ',.0f')} | {fmt(r['lighthouse_kept_of_cp1'], '.0%')} | "
            f"{fmt(r['dense_tok_s_per_rank'], ',.0f')} | {fmt(r['dense_kept_of_cp1'], '.0%')} | "
            f"{fmt(r['lighthouse_speedup'], '.2f')} | "
            f"{fmt(r['lighthouse_peak_gib'], '.1f')} / {fmt(r['dense_peak_gib'], '.1f')} |"
        )
    return "\n".join(lines)


def layer_times_table(records: list[dict]) -> str | None:
    """Where a Lighthouse step goes, per record with per-block times: seconds a step (timed steps' mean) in
    the dense layers, the Lighthouse layers and the rest, and their shares; None without such records."""
    rows = [(r, r["runs"]["lighthouse"]["layer_times"]) for r in records
            if "layer_times" in r.get("runs", {}).get("lighthouse", {})]
    if not rows:
        return None
    lines = ["| CP degree | mode | dense layers | step s | dense layers s (share; fwd / bwd) "
             "| Lighthouse layers s (share; fwd / bwd) | rest s (share) |", "| --- " * 7 + "|"]
    for r, t in rows:
        lines.append(
            f"| {r['cp_degree']} | {mode(r)} | {layers_label(r)} ({t['dense_layers']}) | {t['step_s']:.2f} | "
            f"{t['dense_s']:.2f} ({t['dense_share']:.0%}; {t['dense_forward_s']:.2f} / {t['dense_backward_s']:.2f}) | "
            f"{t['lighthouse_s']:.2f} ({t['lighthouse_share']:.0%}; {t['lighthouse_forward_s']:.2f} / "
            f"{t['lighthouse_backward_s']:.2f}) | {t['rest_s']:.2f} ({t['rest_share']:.0%}) |")
    return "\n".join(lines)


def report(records: list[dict]) -> str:
    """What the variants shared, the environment line and the tables."""
    first = records[0]
    times = layer_times_table(records)
    return (f"\n{describe(first)}, {first['tokens_per_rank']:,} tokens per rank, batch 1, "
            f"activation checkpointing {first['activation_checkpointing']}, "
            f"{first['steps']} steps (first {first.get('warmup_steps', WARMUP_STEPS)} not timed; each run records "
            "its own)\n"
            + " | ".join(f"{k} {v}" for k, v in first["environment"].items()) + "\n" + table(records)
            + ("\n\nWhere the Lighthouse step goes (per-block timing; backward includes the recomputed forward):\n"
               + times if times else ""))


def stage2_report(record: dict) -> str:
    """Stage 1 and the resumed dense stage 2: tok/s per rank, peak memory, the losses around the switch."""
    lines = [f"\n{describe(record)}, CP={record['cp_degree']}, {record['seq_len']:,} tokens, {mode(record)}",
             " | ".join(f"{k} {v}" for k, v in record["environment"].items()),
             "| stage | steps | tok/s per rank | peak GiB | loss, first / last step |", "| --- " * 5 + "|"]
    for stage, run in record["runs"].items():
        losses = run.get("loss_per_step") or [None]
        lines.append(f"| {stage} | {len(run.get('tok_s_per_step', []))} | {fmt(run.get('tok_s'), ',.0f')} | "
                     f"{fmt(run.get('peak_gib'), '.1f')} | {fmt(losses[0], '.3f')} / {fmt(losses[-1], '.3f')} |"
                     + (f" {run['error']}" if "error" in run else ""))
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    """Bars of per-rank tok/s of each attention, per record; beside them, where each timed Lighthouse step
    goes (dense layers, Lighthouse layers, rest). The card, commit and command in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in records if "layer_times" in r.get("runs", {}).get("lighthouse", {})]
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 6, 4.2), squeeze=False)
    ax = axes[0][0]
    shown = [a for a in ATTENTIONS if any(r[f"{a}_tok_s_per_rank"] for r in records)]
    kept = any(r[f"{a}_kept_of_cp1"] is not None for r in records for a in ATTENTIONS)
    width = 0.76 / max(len(shown), 1)
    for i, attention in enumerate(shown):
        xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(records))]
        ys = [r[f"{attention}_tok_s_per_rank"] or 0 for r in records]
        bars = ax.bar(xs, ys, width, label=attention)
        if kept:
            ax.bar_label(bars, labels=[fmt(r[f"{attention}_kept_of_cp1"], ".0%") for r in records], fontsize=8)
    ax.set_xticks(range(len(records)), [label(r) for r in records], fontsize=7)
    ax.set_ylabel("tok/s per rank")
    ax.legend()
    if timed:
        ax = axes[0][1]
        left = [0.0] * len(timed)
        for part, color in (("dense", "tab:orange"), ("lighthouse", "tab:blue"), ("rest", "tab:gray")):
            widths = [r["runs"]["lighthouse"]["layer_times"][f"{part}_s"] for r in timed]
            ax.barh(range(len(timed)), widths, left=left, color=color,
                    label={"dense": "dense layers", "lighthouse": "Lighthouse layers", "rest": "rest"}[part])
            left = [a + b for a, b in zip(left, widths)]
        ax.set_yticks(range(len(timed)), [label(r).replace("\n", " ") for r in timed], fontsize=7)
        ax.set_xlabel("s per Lighthouse step (backward includes the recompute)", fontsize=8)
        ax.legend(fontsize=7)
    env, first = records[0]["environment"], records[0]
    calls = {run["measured_by"]["command"] for r in records for run in r["runs"].values() if "measured_by" in run}
    how = (first.get("command", describe(first)) if len(calls) <= 1
           else f"{describe(first)}: {len(calls)} calls, each variant's command in the JSON (measured_by)")
    fig.suptitle(f"{env['device']}, commit {env['commit']}, {first['tokens_per_rank']:,} tokens per rank\n{how}"
                 + ("\n(bar labels: share of the CP=1 tok/s kept)" if kept else ""), fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)


def label(record: dict) -> str:
    """A record's x label: degree and length, then the mode and dense layers where they vary."""
    text = f"CP={record['cp_degree']}\nN={record['seq_len']:,}\n{mode(record)}"
    return text + (f"\ndense {layers_label(record)}" if record.get("dense_layers") is not None else "")
