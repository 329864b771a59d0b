"""The report of a scripts/replicate.sh run: results.json, the loss-curve PNG and markdown tables.

Reads each arm's metrics.jsonl, the process wall times (walltime.jsonl), the held-out and NIAH JSONs
(eval/) and the corpus manifest. Time is reported two ways: `wall_clock_s`, the elapsed time of the
arm's training processes (start-up, first-step kernel compilation and checkpoint saves included), and
`loop_s`, each stage's steps x tokens per step / its median logged tok/s (the steady-state training loop).
Every arm sees the same batch at the same step, so the switch analysis compares an arm with the dense arm
step by step (`gap` = arm loss - dense loss on the same batch):

- gap before the switch: mean gap over the last 5 logged Lighthouse steps (stage 1 logs every 10 steps);
- spike: the largest gap in the first 20 dense steps after the switch, minus the gap before;
- recovery steps: the first dense step r (1 = the first after the switch) from which the mean gap over the
  next 10 steps is back at the gap before the switch (null when it never is);
- steps to match dense: the first r from which that 10-step mean gap is <= 0 (null when it never is).
"""
from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from torchtitan.config import ConfigManager

from recipe.logs.layout import METRICS_FILE, read_json_lines, read_metrics
from recipe.logs.run_logs import LOSS_TAG, TPS_TAG
from recipe.logs.run_record import REPO

DOCS = REPO / "docs" / "records"  # where a published report's results.json and replicate_loss.png go
FINAL_WINDOW = 20  # steps averaged for the final training loss
SPIKE_WINDOW = 20  # dense steps after a switch searched for the spike
SMOOTH = 10  # moving-mean window of the gap for recovery
BEFORE = 5  # logged stage-1 steps averaged for the gap before a switch
PUBLISHED = ("results.json", "replicate_loss.png")


@dataclass
class Arm:
    """One arm of the replication: its training losses over both stages and its processes' wall-time entries."""

    name: str
    lighthouse_steps: int
    losses: dict[int, float]  # step -> training loss, both stages
    stages: list[tuple[str, list[str]]]  # (stage name, walltime.jsonl entries that make it up)


def read_steps(run: Path, folder: str) -> list[dict]:
    """The step records of `<run>/<folder>/metrics.jsonl`, read as the recipe writes them (events left out)."""
    return read_metrics(str(run / folder / METRICS_FILE))


def losses_by_step(records: list[dict], first: int = 1, last: int | None = None) -> dict[int, float]:
    """step -> training loss of the records of steps first..last."""
    return {r["step"]: r[LOSS_TAG] for r in records if r["step"] >= first and (last is None or r["step"] <= last)}


def moving_mean(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values ending at each position."""
    return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def first_window_at_most(values: list[float], window: int, level: float) -> int | None:
    """1-based position of the first full `window` whose mean is <= level; None if none is."""
    return next((i + 1 for i in range(len(values) - window + 1)
                 if statistics.fmean(values[i:i + window]) <= level), None)


def switch_analysis(arm: Arm, dense: dict[int, float], steps: int) -> dict:
    """Gap to the dense arm before and after the switch (see the module docstring)."""
    switch = arm.lighthouse_steps
    logged = sorted(s for s in arm.losses if s <= switch and s in dense)[-BEFORE:]
    before = statistics.fmean(arm.losses[s] - dense[s] for s in logged)
    after = [arm.losses[s] - dense[s] for s in range(switch + 1, steps + 1)]
    return {
        "gap_before_switch": before,
        "peak_gap_after_switch": max(after[:SPIKE_WINDOW]),
        "switch_spike": max(after[:SPIKE_WINDOW]) - before,
        "recovery_steps": first_window_at_most(after, SMOOTH, before),
        "steps_to_match_dense": first_window_at_most(after, SMOOTH, 0.0),
        "final_gap_to_dense": statistics.fmean(after[-FINAL_WINDOW:]),
    }


def switch_steps(steps: int) -> list[int]:
    """The steps after which the switch arms turn dense: 5/8 and 3/4 of the run (scripts/replicate.sh)."""
    return [steps * 5 // 8, steps * 3 // 4]


def load_arms(run: Path, steps: int, switches: list[int]) -> list[Arm]:
    """The dense arm and one arm per switch step: stage 1's losses up to the switch, then its stage 2's."""
    stage1 = read_steps(run, "lighthouse")
    arms = [Arm("dense", 0, losses_by_step(read_steps(run, "dense")),
                [("dense", [f"dense-to-{steps}"])])]
    for switch in switches:
        stage1_runs = [f"lighthouse-to-{s}" for s in switches if s <= switch]
        losses = {**losses_by_step(stage1, last=switch),
                  **losses_by_step(read_steps(run, f"switch_{switch}"), first=switch + 1)}
        arms.append(Arm(f"switch_{switch}", switch, losses,
                        [("lighthouse", stage1_runs), ("dense", [f"switch_{switch}-to-{steps}"])]))
    return arms


def stage_seconds(walltimes: dict[str, float], entries: list[str]) -> float:
    """Seconds of the training processes named `entries` in walltime.jsonl; ValueError naming one missing."""
    missing = [e for e in entries if e not in walltimes]
    if missing:
        raise ValueError(f"walltime.jsonl has no entry {missing}")
    return sum(walltimes[e] for e in entries)


def median_tps(run: Path, folder: str, first: int, last: int) -> float:
    """Median logged tok/s of a run's steps in [first, last] (robust to each process's slow first step)."""
    records = [r for r in read_steps(run, folder) if first <= r["step"] <= last]
    return statistics.median(r[TPS_TAG] for r in records)


def eval_json(run: Path, kind: str, name: str) -> dict:
    """The `<kind>_<name>.json` record (heldout, niah) the evaluations wrote under `<run>/eval/`."""
    return json.loads((run / "eval" / f"{kind}_{name}.json").read_text())


def summarize(run: Path, steps: int, tokens_per_step: int) -> dict:
    """The results object: device, tokens per arm, one entry per arm, stage-1 held-out losses, corpus."""
    switches = switch_steps(steps)
    arms = load_arms(run, steps, switches)
    missing = [(a.name, s) for a in arms for s in range(a.lighthouse_steps + 1, steps + 1) if s not in a.losses]
    if missing:
        raise ValueError(f"dense steps without a logged loss (log every dense step): {missing[:5]}")
    walltimes = {w["name"]: w["end"] - w["start"] for w in read_json_lines(str(run / "walltime.jsonl"))}
    dense = arms[0].losses
    results = []
    for arm in arms:
        heldout = eval_json(run, "heldout", arm.name)
        stage_steps = {"lighthouse": arm.lighthouse_steps, "dense": steps - arm.lighthouse_steps}
        stage_tok_s = ({"lighthouse": median_tps(run, "lighthouse", 1, arm.lighthouse_steps)}
                       if arm.lighthouse_steps else {})
        stage_tok_s["dense"] = median_tps(run, arm.name, arm.lighthouse_steps + 1, steps)
        stage_loop_s = {name: stage_steps[name] * tokens_per_step / tps for name, tps in stage_tok_s.items()}
        entry = {
            "name": arm.name,
            "lighthouse_steps": arm.lighthouse_steps,
            "dense_steps": steps - arm.lighthouse_steps,
            "final_train_loss": statistics.fmean(arm.losses[s] for s in range(steps - FINAL_WINDOW + 1, steps + 1)),
            "final_heldout_loss": heldout["loss"]["dense"],
            "wall_clock_s": sum(stage_seconds(walltimes, e) for _, e in arm.stages),
            "niah_mean": eval_json(run, "niah", arm.name)["mean"],
            "stage_wall_clock_s": {name: stage_seconds(walltimes, e) for name, e in arm.stages},
            "stage_tok_s": stage_tok_s,
            "stage_loop_s": stage_loop_s,
            "loop_s": sum(stage_loop_s.values()),
        }
        if arm.lighthouse_steps:
            entry.update(switch_analysis(arm, dense, steps))
        results.append(entry)
    stage1 = {str(s): {**eval_json(run, "heldout", f"stage1_{s}")["loss"],
                       "niah_mean_lighthouse": eval_json(run, "niah", f"stage1_{s}")["mean"]} for s in switches}
    first_eval = eval_json(run, "heldout", "dense")
    return {
        "device": first_eval["device"],
        "tokens_per_arm": steps * tokens_per_step,
        "arms": results,
        "steps": steps,
        "tokens_per_step": tokens_per_step,
        "seq_len": first_eval["seq_len"],
        "stage1_heldout_loss": stage1,
        "corpus": json.loads((run / "corpus" / "manifest.json").read_text()),
        "date": first_eval["date"],
        "commit": first_eval["commit"],
    }


def plot_losses(run: Path, steps: int, path: Path) -> None:
    """Training loss of every arm (left) and each switch arm's gap to dense on the same batches (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    switches = switch_steps(steps)
    arms = load_arms(run, steps, switches)
    dense = arms[0].losses
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm, color in zip(arms, ("black", "tab:blue", "tab:orange")):
        # Left: every arm on the steps stage 1 logs (the same batches), trailing mean over 5 of them.
        sampled = [s for s in sorted(arm.losses) if s % 10 == 0]
        left.plot(sampled, moving_mean([arm.losses[s] for s in sampled], BEFORE), color=color, label=arm.name)
        if arm.lighthouse_steps:
            left.axvline(arm.lighthouse_steps, color=color, linewidth=0.8, linestyle="--")
            after = list(range(arm.lighthouse_steps + 1, steps + 1))
            gap = moving_mean([arm.losses[s] - dense[s] for s in after], SMOOTH)
            right.plot(after, gap, color=color, label=f"{arm.name}, dense ({SMOOTH}-step mean)")
            logged = [s for s in sorted(arm.losses) if s <= arm.lighthouse_steps and s >= switches[0] - 100]
            right.plot(logged, [arm.losses[s] - dense[s] for s in logged], color=color, marker=".", linestyle=":",
                       label=f"{arm.name}, Lighthouse (logged steps)")
    left.set_ylim(top=min(4.0, left.get_ylim()[1]))
    left.set(xlabel="step", ylabel="training loss (nats/byte)",
             title=f"training loss every 10th step (same batches), mean of {BEFORE}; dashed: switch")
    left.legend(fontsize=7)
    right.axhline(0, color="black", linewidth=0.8)
    right.set(xlabel="step", ylabel="loss - dense arm's loss",
              title="gap to the dense arm on the same batches")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(results: dict) -> str:
    """The arms table and the stage-1 table, as pasted into docs/studies/recoverability.md."""
    def fmt(x, spec=".4f"):
        return "never" if x is None else format(x, spec) if isinstance(x, float) else str(x)

    lines = ["| arm | Lighthouse steps | dense steps | final train loss | gap to dense (last 20 steps) | "
             "held-out loss | NIAH mean | wall-clock s (stage 1 + stage 2) | training-loop s | spike at switch | "
             "recovery steps | steps to match dense |", "| --- " * 12 + "|"]
    for a in results["arms"]:
        stages = " + ".join(f"{v:.0f}" for v in a["stage_wall_clock_s"].values())
        lines.append(f"| {a['name']} | {a['lighthouse_steps']} | {a['dense_steps']} | {a['final_train_loss']:.4f} | "
                     f"{fmt(a.get('final_gap_to_dense', 0.0), '+.4f')} | {a['final_heldout_loss']:.4f} | "
                     f"{a['niah_mean']:.3f} | {a['wall_clock_s']:.0f} ({stages}) | {a['loop_s']:.1f} | "
                     f"{fmt(a.get('switch_spike'), '+.4f') if a['lighthouse_steps'] else '-'} | "
                     f"{fmt(a.get('recovery_steps')) if a['lighthouse_steps'] else '-'} | "
                     f"{fmt(a.get('steps_to_match_dense')) if a['lighthouse_steps'] else '-'} |")
    lines += ["", "| stage-1 checkpoint | held-out loss, Lighthouse | held-out loss, dense (same weights) | "
                  "NIAH mean, Lighthouse |", "| --- | --- | --- | --- |"]
    for step, r in results["stage1_heldout_loss"].items():
        lines.append(f"| step {step} | {r['lighthouse']:.4f} | {r['dense']:.4f} | {r['niah_mean_lighthouse']:.3f} |")
    return "\n".join(lines) + "\n"


def tokens_per_step(job_argv: list[str]) -> int:
    """Global batch x sequence length of the job the arms ran (TOML plus overrides)."""
    training = ConfigManager().parse_args(job_argv).training
    batch = training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size
    return batch * training.seq_len


def write_report(run: Path, steps: int, tokens_per_step: int, out: Path, publish_to: Path | None = None
                 ) -> tuple[dict, str]:
    """Write results.json, replicate_loss.png and report.md (the tables) into `out`, and copy the first two
    into `publish_to` if given; returns the results and the tables."""
    results = summarize(run, steps, tokens_per_step)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot_losses(run, steps, out / "replicate_loss.png")
    table = markdown(results)
    (out / "report.md").write_text(table)
    if publish_to is not None:
        for name in PUBLISHED:
            shutil.copyfile(out / name, publish_to / name)
    return results, table
