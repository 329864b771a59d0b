"""Matched compute: each seed's time-matched dense frontier, and every Lighthouse -> dense arm placed on it.

The frontier of a seed is the final held-out loss of dense runs whose whole schedule (warm-up, decay to 0) ends at
different lengths (`[study] frontier`, named `dense_s<seed>_steps<n>`, plus the study's own `dense_s<seed>`).
Time is counted in **dense-equivalent steps**, measured on each run's own machine, because machines of one card
kind differ by more than the effects measured: a Lighthouse -> dense arm's training seconds over the mean seconds
of its own stage-2 steps (dense steps of the same model, on the same GPU, in the same process); a dense run's are
its steps. Per arm and seed: the paired difference at equal compute (the arm's final loss minus the frontier at
its dense-equivalent steps, linear between neighbouring lengths) and the speedup at equal loss (the frontier's
first steps at the arm's loss over the arm's dense-equivalent steps), then their distributions over seeds
(docs/studies/time_to_quality_long.md, addendum 2).
"""
from __future__ import annotations

import re
import statistics

from eval.studies.payoff import bootstrap_interval, interval_text, rounded_interval, save_figure
from eval.studies.time_to_quality import arm_label

_DENSE = re.compile(r"dense(?:_s(?P<seed>\d+))?(?:_steps(?P<steps>\d+))?")
# The study's time check: the frontier runs' seconds per step within 2% of each other on each card model (a steady
# machine; a study whose seeds ran on two card models matches each seed on its own card's frontier).
STEP_TIME_SPREAD = 0.02


def validated_steps(record: dict, validation_freq: int) -> list[int]:
    """The steps of a record's curve: its `step_curve`, or for older records step 1 and every
    `validation_freq`-th step up to the last (ValueError when that does not match the curve's length)."""
    if "step_curve" in record:
        return [int(step) for step, _ in record["step_curve"]]
    steps = [1] + list(range(validation_freq, record["total_steps"] + 1, validation_freq))
    if steps[-1] != record["total_steps"]:
        steps.append(record["total_steps"])
    if len(steps) != len(record["curve"]):
        raise ValueError(f"{record['name']}: {len(record['curve'])} curve points do not match the validated "
                         f"steps {steps[0]}..{steps[-1]} every {validation_freq}")
    return steps


def dense_equivalent_steps(record: dict, validation_freq: int) -> float:
    """A run's training seconds in units of its own dense steps: a dense run's steps; a Lighthouse -> dense arm's
    seconds over the mean seconds of its stage-2 steps."""
    if record["selection"] == "dense":
        return float(record["total_steps"])
    switch, total = record["switch_step"], record["total_steps"]
    seconds = dict(zip(validated_steps(record, validation_freq), (t for t, _ in record["curve"])))
    if switch not in seconds:
        raise ValueError(f"{record['name']}: its curve has no point at the switch step {switch}")
    stage2_step = (seconds[total] - seconds[switch]) / (total - switch)
    return record["train_seconds"] / stage2_step


def frontiers(records: list[dict]) -> dict[int, list[dict]]:
    """seed -> that seed's dense runs of every length, shortest first: {steps, loss, seconds, name, device}."""
    points: dict[int, dict[int, dict]] = {}
    for r in records:
        match = _DENSE.fullmatch(r["name"])
        if r["selection"] != "dense" or match is None:
            continue
        steps = int(match["steps"] or r["total_steps"])
        points.setdefault(r["seed"], {})[steps] = {"steps": steps, "loss": r["final_heldout_loss"],
                                                   "seconds": r["train_seconds"], "name": r["name"],
                                                   "device": r.get("device")}
    return {seed: [by_steps[n] for n in sorted(by_steps)] for seed, by_steps in sorted(points.items())}


def loss_at(frontier: list[dict], steps: float) -> float | None:
    """The frontier's loss at `steps`, linear between neighbouring lengths; None outside its lengths."""
    for a, b in zip(frontier, frontier[1:]):
        if a["steps"] <= steps <= b["steps"]:
            return a["loss"] + (b["loss"] - a["loss"]) * (steps - a["steps"]) / (b["steps"] - a["steps"])
    return None


def steps_to_reach(frontier: list[dict], loss: float) -> tuple[float | None, str]:
    """The first steps at which the frontier (linear between lengths) reaches `loss`: (steps, "") when it does,
    (shortest length, "below") when its shortest run is already there, (longest length, "above") when it never
    gets there."""
    if frontier[0]["loss"] <= loss:
        return float(frontier[0]["steps"]), "below"
    for a, b in zip(frontier, frontier[1:]):
        if b["loss"] <= loss:
            return a["steps"] + (b["steps"] - a["steps"]) * (a["loss"] - loss) / (a["loss"] - b["loss"]), ""
    return float(frontier[-1]["steps"]), "above"


def place(records: list[dict], validation_freq: int, lengths: int, baseline: str | None = None,
          seeds: list[int] | None = None) -> dict:
    """Every Lighthouse -> dense arm on its seed's frontier, for seeds whose frontier has `lengths` lengths:
    per-seed rows and, per arm, the distribution over seeds; with `baseline` (an arm label), every other arm
    against it too (`against_baseline`), its rule read only when all of `seeds` are placed for both."""
    fronts = {seed: f for seed, f in frontiers(records).items() if len(f) >= lengths}
    arms: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: (arm_label(r["name"]), r["seed"])):
        if r["selection"] == "dense" or r["seed"] not in fronts:
            continue
        front, steps = fronts[r["seed"]], dense_equivalent_steps(r, validation_freq)
        at = loss_at(front, steps)
        reach, bound = steps_to_reach(front, r["final_heldout_loss"])
        arms.setdefault(arm_label(r["name"]), {})[r["seed"]] = {
            "final": round(r["final_heldout_loss"], 4), "dense_equivalent_steps": round(steps, 1),
            "seconds": r["train_seconds"], "device": r.get("device"), "commit": r.get("commit"),
            "frontier_at_equal_compute": None if at is None else round(at, 4),
            "difference": None if at is None else round(r["final_heldout_loss"] - at, 4),
            "speedup_at_equal_loss": round(reach / steps, 4), "speedup_bound": bound}
    summary = {}
    for arm, rows in arms.items():
        diffs = [row["difference"] for row in rows.values() if row["difference"] is not None]
        interval = bootstrap_interval(diffs)
        summary[arm] = {
            "seeds": rows, "n": len(diffs), "mean_difference": round(statistics.fmean(diffs), 4) if diffs else None,
            "interval95": rounded_interval(interval), "below_zero": sum(d < 0 for d in diffs),
            "median_speedup": round(statistics.median(row["speedup_at_equal_loss"] for row in rows.values()), 4),
            "verdict": verdict(interval)}
    if baseline in summary:
        for arm, entry in summary.items():
            if arm != baseline:
                entry["against_baseline"] = against(entry["seeds"], summary[baseline]["seeds"], baseline, seeds)
    seconds_per_step = {seed: [round(p["seconds"] / p["steps"], 4) for p in f] for seed, f in fronts.items()}
    by_card: dict[str, list[float]] = {}
    for seed, f in fronts.items():
        for p, time in zip(f, seconds_per_step[seed]):
            by_card.setdefault(p["device"] or "an unnamed card", []).append(time)
    spreads = {card: step_time_spread(times) for card, times in by_card.items()}
    worst = max(spreads, key=lambda card: spreads[card] or 0.0, default=None)
    return {"frontiers": {seed: [{k: p[k] for k in ("steps", "loss", "seconds")} for p in f]
                          for seed, f in fronts.items()},
            "seconds_per_step": seconds_per_step, "seconds_per_step_by_card": by_card,
            "step_time_spread": spreads.get(worst), "step_time_spread_card": worst, "arms": summary}


def against(arm: dict[int, dict], base: dict[int, dict], baseline: str, seeds: list[int] | None) -> dict:
    """The arm against `baseline` at equal compute (docs/studies/time_to_quality_long.md, addendum 5): per seed
    both place, (arm - its frontier) - (baseline - its frontier), their mean, interval and the rule, which is read
    only when every seed of `seeds` is among them."""
    shared = sorted(s for s in set(arm) & set(base)
                    if arm[s]["difference"] is not None and base[s]["difference"] is not None)
    deltas = [round(arm[s]["difference"] - base[s]["difference"], 4) for s in shared]
    interval = bootstrap_interval(deltas)
    missing = sorted(set(seeds or shared) - set(shared))
    rule = verdict(interval, f" than {baseline}") if not missing else f"not read: seeds {missing} not placed"
    return {"baseline": baseline, "seeds": shared, "differences": deltas,
            "mean": round(statistics.fmean(deltas), 4) if deltas else None,
            "interval95": rounded_interval(interval), "below_zero": sum(d < 0 for d in deltas), "verdict": rule}


def step_time_spread(times: list[float]) -> float | None:
    """(slowest - fastest) / fastest of frontier runs' seconds per step (None without two)."""
    return round((max(times) - min(times)) / min(times), 4) if len(times) > 1 and min(times) > 0 else None


def time_check_line(placed: dict) -> str | None:
    """A warning when the frontier runs of one card model spread beyond the study's 2% in step time: seconds then
    measure the machine's load as much as the work, and so do the comparisons at equal GPU-seconds. Cards are not
    compared with each other: each seed is placed on its own frontier, trained on one card model."""
    spread, card = placed.get("step_time_spread"), placed.get("step_time_spread_card")
    if spread is None or spread <= STEP_TIME_SPREAD:
        return None
    by_card = placed["seconds_per_step_by_card"]
    times, on = by_card[card], f" on {card}" if len(by_card) > 1 else ""
    return (f"**Time check failed**: the frontier runs' seconds per step{on} spread {spread:.0%} ({min(times):.3g}-"
            f"{max(times):.3g} s), beyond the study's {STEP_TIME_SPREAD:.0%}: the machine's speed changed between runs "
            "(shared or loaded), so the comparisons at equal GPU-seconds below measure that as much as the runs.")


def verdict(interval: tuple[float, float] | None, than: str = "") -> str:
    """The pre-registered rule on the 95% interval of the mean paired difference (arm - frontier; with `than`,
    " than <the arm it is against>")."""
    if interval is None:
        return "too few seeds"
    if interval[1] < 0:
        return f"better{than} at equal compute"
    if interval[0] > 0:
        return f"worse{than} at equal compute"
    return "not resolved"


def _speedup(row: dict) -> str:
    value = f"{row['speedup_at_equal_loss']:.2f}x"
    return {"below": f"<= {value}", "above": f">= {value}"}.get(row["speedup_bound"], value)


def markdown(placed: dict) -> str:
    """At equal GPU-seconds and at equal loss, per seed and as distributions; then the frontiers. A failed time
    check comes first."""
    if not placed["frontiers"]:
        return ("At equal GPU-seconds: no seed has every length of its time-matched dense frontier yet, so no arm "
                "is placed.")
    warning = time_check_line(placed)
    lines = [warning, ""] if warning else []
    lines += ["At equal GPU-seconds (dense-equivalent steps) and at equal loss, on each seed's time-matched dense "
              "frontier:", "",
              "| arm | seeds | arm - frontier at equal compute, per seed | mean | 95% bootstrap interval | below 0 | "
              "speedup at equal loss, per seed | median | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for arm, entry in placed["arms"].items():
        seeds = entry["seeds"]
        diffs = " ".join("-" if row["difference"] is None else f"{row['difference']:+.3f}" for row in seeds.values())
        interval = interval_text(entry["interval95"])
        mean = "-" if entry["mean_difference"] is None else f"{entry['mean_difference']:+.4f}"
        lines.append(f"| {arm} | {','.join(map(str, seeds))} | {diffs} | {mean} | {interval} | "
                     f"{entry['below_zero']}/{entry['n']} | {' '.join(_speedup(r) for r in seeds.values())} | "
                     f"{entry['median_speedup']:.2f}x | {entry['verdict']} |")
    compared = {arm: entry["against_baseline"] for arm, entry in placed["arms"].items() if "against_baseline" in entry}
    if compared:
        baseline = next(iter(compared.values()))["baseline"]
        lines += ["", f"Against {baseline} at equal GPU-seconds: per seed, (arm - frontier) - ({baseline} - frontier):",
                  "", "| arm | seeds | per seed | mean | 95% bootstrap interval | below 0 | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for arm, row in compared.items():
            interval = interval_text(row["interval95"])
            mean = "-" if row["mean"] is None else f"{row['mean']:+.4f}"
            lines.append(f"| {arm} | {','.join(map(str, row['seeds'])) or '-'} | "
                         f"{' '.join(f'{d:+.3f}' for d in row['differences']) or '-'} | {mean} | {interval} | "
                         f"{row['below_zero']}/{len(row['seeds'])} | {row['verdict']} |")
    lengths = sorted({p["steps"] for f in placed["frontiers"].values() for p in f})
    lines += ["", "| seed | " + " | ".join(f"{n} steps" for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for seed, front in placed["frontiers"].items():
        by_steps = {p["steps"]: p for p in front}
        lines.append(f"| {seed} | " + " | ".join(
            f"{by_steps[n]['loss']:.4f} ({by_steps[n]['seconds']:.0f} s)" if n in by_steps else "-"
            for n in lengths) + " |")
    return "\n".join(lines)


def plot(placed: dict, path: str, title: str) -> None:
    """Each seed's frontier (loss against dense-equivalent steps) with its Lighthouse arms as points on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers, labelled = "os^vDP*X", set()
    for i, (seed, front) in enumerate(placed["frontiers"].items()):
        color = colors[i % len(colors)]
        ax.plot([p["steps"] for p in front], [p["loss"] for p in front], "-", color=color, lw=1,
                label=f"dense frontier, seed {seed}")
        for j, (arm, entry) in enumerate(placed["arms"].items()):
            row = entry["seeds"].get(seed)
            if row is not None:
                ax.plot(row["dense_equivalent_steps"], row["final"], markers[j % len(markers)], color=color, ms=6,
                        label=None if arm in labelled else f"{arm} (marker; colour = seed)")
                labelled.add(arm)
    save_figure(fig, ax, "dense-equivalent steps (training seconds over the run's own dense step time)",
                "final held-out loss, dense attention (nats/byte)", path, title)
