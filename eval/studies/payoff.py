"""The pay-off map's report: distributions of final held-out loss over seeds, not means.

Input: the time-to-quality records of every run (`eval.studies.time_to_quality.report_records`, each paired with the
dense run of its seed), possibly joined by earlier records of the same study. Output: per arm, every seed's final
loss and its group (below or above a threshold fixed in advance), the paired differences to dense (and to a
baseline arm) with a bootstrap interval over seeds, and per-seed time to quality.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np

from eval.studies.time_to_quality import arm_label

BOOTSTRAP_RESAMPLES = 10_000


def bootstrap_interval(values: list[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
                       ) -> tuple[float, float] | None:
    """95% percentile interval of the mean of `values` over resampled seeds; None for fewer than 2 values."""
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    samples = rng.choice(np.asarray(values, dtype=np.float64), size=(resamples, len(values)), replace=True)
    low, high = np.percentile(samples.mean(axis=1), [2.5, 97.5])
    return float(low), float(high)


def rounded_interval(interval: tuple[float, float] | None) -> list[float] | None:
    """A `bootstrap_interval` as a record keeps it (4 decimals; None stays None)."""
    return None if interval is None else [round(v, 4) for v in interval]


def interval_text(interval: list[float] | None) -> str:
    """A record's 95% interval as a table cell: "[-0.0560, -0.0160]", or "-" without one."""
    return "-" if interval is None else f"[{interval[0]:+.4f}, {interval[1]:+.4f}]"


def largest_gap_split(losses: list[float]) -> float | None:
    """The midpoint of the largest gap between consecutive sorted losses (a description, decides nothing)."""
    ordered = sorted(losses)
    if len(ordered) < 2:
        return None
    i = max(range(len(ordered) - 1), key=lambda j: ordered[j + 1] - ordered[j])
    return (ordered[i] + ordered[i + 1]) / 2


def by_arm(records: list[dict]) -> dict[str, dict[int, dict]]:
    """{arm label: {seed: record}} (the dense records of seed 0 are named plain `dense` in older files)."""
    arms: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in records:
        arms[arm_label(r["name"])][r["seed"]] = r
    return dict(arms)


KEPT_FROM_EARLIER = ("note", "position_losses")


def join(records: list[dict], earlier: list[dict]) -> list[dict]:
    """`earlier` records (joined from earlier reports) of runs not among `records`, then `records`: a run's own
    folder wins over its copy in a report that is joined again, and keeps from that copy what the folder cannot
    give again (`KEPT_FROM_EARLIER`: the note written into the record, the loss by position of a per-token dump
    that is no longer there)."""
    copies = {(arm_label(r["name"]), r["seed"]): r for r in earlier}
    joined = []
    for record in records:
        copy = copies.pop((arm_label(record["name"]), record["seed"]), {})
        joined.append({**{k: copy[k] for k in KEPT_FROM_EARLIER if k in copy}, **record})
    return list(copies.values()) + joined


def stage0_confounded(records: list[dict], earlier: list[dict]) -> list[dict]:
    """The `records` of a context-extension study whose stage 0 is not the one their seed's `earlier` records started
    from, told by its final held-out loss (`stage0_final_heldout_loss`), which a stage 0 trained again in
    deterministic mode repeats exactly: runs that must not join those seeds."""
    started: dict[int, set[float]] = {}
    for r in earlier:
        if (loss := r.get("stage0_final_heldout_loss")) is not None:
            started.setdefault(r["seed"], set()).add(loss)
    return [r for r in records if r["seed"] in started and r.get("stage0_final_heldout_loss") not in started[r["seed"]]]


def card_mixed(records: list[dict], earlier: list[dict]) -> list[dict]:
    """The `records` of a seed whose runs name more than one card in their `cards` (their run records' cards, its
    `earlier` records' included): a seed is placed against its own dense runs, so all of it must time on one card
    model. Records without `cards` (written before runs recorded them) are not checked."""
    seeds: dict[int, set[str]] = defaultdict(set)
    for r in records + earlier:
        seeds[r["seed"]].update(r.get("cards", ()))
    return [r for r in records if len(seeds[r["seed"]]) > 1]


def paired(arms: dict[str, dict[int, dict]], arm: str, reference: str) -> dict:
    """`arm` minus `reference` on the seeds both ran: each seed's difference of final loss, their mean, the
    bootstrap interval and how many are below 0."""
    seeds = sorted(set(arms[arm]) & set(arms.get(reference, {})))
    diffs = [arms[arm][s]["final_heldout_loss"] - arms[reference][s]["final_heldout_loss"] for s in seeds]
    interval = bootstrap_interval(diffs)
    return {"arm": arm, "reference": reference, "seeds": seeds, "differences": [round(d, 4) for d in diffs],
            "mean": round(statistics.mean(diffs), 4) if diffs else None,
            "interval95": rounded_interval(interval), "below_zero": sum(d < 0 for d in diffs)}


def time_to_quality_bound(record: dict, dense: dict | None) -> dict:
    """For a run whose final loss the dense run of its seed never reaches: its time to quality is at least dense's
    whole training time over the run's (`time_to_quality_at_least`). Leaving such runs out of the median would
    drop exactly the seeds where the arm did best."""
    never_reached = "dense_seconds_to_this_loss" in record and record["dense_seconds_to_this_loss"] is None
    if dense is None or not never_reached:  # dense runs have no such key
        return {}
    return {"time_to_quality_at_least": round(dense["train_seconds"] / record["train_seconds"], 4)}


def distributions(records: list[dict], threshold: float | None, baseline: str | None = None) -> dict:
    """Every arm's finals by seed with their group, group counts, time to quality per seed, and the paired
    differences to dense and to `baseline`."""
    arms = by_arm(records)
    finals = [r["final_heldout_loss"] for r in records]
    summary: dict = {"threshold": threshold, "largest_gap_split": largest_gap_split(finals), "arms": {},
                     "paired": []}
    for arm, seeds in sorted(arms.items(), key=lambda item: (item[0] != "dense", item[0])):
        rows = {s: {"final": round(r["final_heldout_loss"], 4), "commit": r.get("commit"), "device": r.get("device"),
                    **({"group": "lower" if r["final_heldout_loss"] < threshold else "upper"}
                       if threshold is not None else {}),
                    **({"time_to_quality": r["time_to_quality_speedup"]} if "time_to_quality_speedup" in r else {}),
                    **({"bits_per_byte": round(r["final_bits_per_byte"], 4)} if "final_bits_per_byte" in r else {}),
                    **time_to_quality_bound(r, arms.get("dense", {}).get(s))}
                for s, r in sorted(seeds.items())}
        entry: dict = {"seeds": rows}
        if threshold is not None:
            entry["lower"] = sum(row["group"] == "lower" for row in rows.values())
            entry["upper"] = len(rows) - entry["lower"]
        speedups = [row["time_to_quality"] for row in rows.values() if row.get("time_to_quality") is not None]
        bounds = [row["time_to_quality_at_least"] for row in rows.values() if "time_to_quality_at_least" in row]
        if speedups or bounds:
            median = statistics.median(speedups + bounds)
            entry["time_to_quality_median"] = round(median, 4)
            if any(bound <= median for bound in bounds):
                entry["time_to_quality_median_at_least"] = True
        summary["arms"][arm] = entry
        if arm != "dense" and "dense" in arms:
            summary["paired"].append(paired(arms, arm, "dense"))
    if baseline in arms:
        summary["paired"] += [paired(arms, arm, baseline) for arm in sorted(arms) if arm not in ("dense", baseline)]
    return summary


def dense_step_curves(records: list[dict], validation_freq: int) -> dict[int, list[tuple[float, float]]]:
    """Every dense record's held-out loss by step, seed -> [(step, loss)]: its `step_curve`, or, for a record
    written before that key, its seconds curve on the steps the config validates (step 1 and every
    `validation_freq`-th up to the last), when it has exactly one point for each of them."""
    curves = {}
    for record in records:
        if arm_label(record["name"]) != "dense":  # frontier runs have schedules of their own
            continue
        if "step_curve" in record:
            curves[record["seed"]] = [(float(s), v) for s, v in record["step_curve"]]
            continue
        steps = [1] + list(range(validation_freq, record["total_steps"] + 1, validation_freq))
        if len(steps) == len(record["curve"]):
            curves[record["seed"]] = [(float(s), v) for s, (_, v) in zip(steps, record["curve"])]
    return curves


def separation_step(dense_curves: dict[int, list[tuple[float, float]]], lower: set[int]) -> int | None:
    """The first validated step from which every lower-group dense seed stays below every upper-group one
    (curves: seed -> [(step, loss)] on the same steps); None if they never separate or a group is empty."""
    upper = set(dense_curves) - lower
    if not lower or not upper:
        return None
    steps = [step for step, _ in next(iter(dense_curves.values()))]
    losses = {seed: dict(curve) for seed, curve in dense_curves.items()}
    separated = [max(losses[s][t] for s in lower) < min(losses[s][t] for s in upper) for t in steps]
    for i, step in enumerate(steps):
        if all(separated[i:]):
            return int(step)
    return None


def markdown(summary: dict) -> str:
    """Tables: every seed's final loss by arm (group and time to quality), then the paired differences."""
    seeds = sorted({s for arm in summary["arms"].values() for s in arm["seeds"]})
    lines = ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | lower / upper | median time to quality |",
             "|---|" + "---|" * (len(seeds) + 2)]
    for arm, entry in summary["arms"].items():
        cells = []
        for s in seeds:
            row = entry["seeds"].get(s)
            if row is None:
                cells.append("-")
                continue
            mark = {"lower": " (L)", "upper": ""}.get(row.get("group"), "")
            tq = (f", {row['time_to_quality']:.2f}x" if row.get("time_to_quality") is not None
                  else f", >= {row['time_to_quality_at_least']:.2f}x" if "time_to_quality_at_least" in row else "")
            cells.append(f"{row['final']:.4f}{mark}{tq}")
        groups = f"{entry['lower']} / {entry['upper']}" if "lower" in entry else "-"
        median = (">= " if entry.get("time_to_quality_median_at_least") else "") + str(
            entry.get("time_to_quality_median", "-"))
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {groups} | {median} |")
    if any("bits_per_byte" in row for arm in summary["arms"].values() for row in arm["seeds"].values()):
        lines += ["", "Final held-out loss in bits per byte (comparable across tokenizers):", "",
                  "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
        for arm, entry in summary["arms"].items():
            cells = [f"{entry['seeds'][s]['bits_per_byte']:.4f}" if "bits_per_byte" in entry["seeds"].get(s, {})
                     else "-" for s in seeds]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "| arm - reference | seeds | differences | mean | 95% bootstrap interval | below 0 |",
              "|---|---|---|---|---|---|"]
    for p in summary["paired"]:
        interval = interval_text(p["interval95"])
        mean = "-" if p["mean"] is None else f"{p['mean']:+.4f}"
        lines.append(f"| {p['arm']} - {p['reference']} | {','.join(map(str, p['seeds']))} | "
                     f"{' '.join(f'{d:+.3f}' for d in p['differences'])} | {mean} | {interval} | "
                     f"{p['below_zero']}/{len(p['seeds'])} |")
    return "\n".join(lines)


def plot_finals(summary: dict, path: str, title: str, newest: str | None = None) -> None:
    """Every run's final held-out loss, one column per arm, one point per seed (runs of other commits than
    `newest`, the report's own, hollow), the group threshold dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(summary["arms"])
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(arms), 4.5))
    for x, arm in enumerate(arms):
        rows = summary["arms"][arm]["seeds"]
        for i, (seed, row) in enumerate(sorted(rows.items())):
            jitter = (i - (len(rows) - 1) / 2) * 0.06
            hollow = newest is not None and row["commit"] != newest
            ax.plot(x + jitter, row["final"], "o", ms=6, mfc="none" if hollow else "tab:blue", mec="tab:blue")
            ax.annotate(str(seed), (x + jitter, row["final"]), fontsize=6, xytext=(4, -2), textcoords="offset points")
    if summary["threshold"] is not None:
        ax.axhline(summary["threshold"], color="grey", ls="--", lw=0.8, label=f"group threshold {summary['threshold']}")
        ax.legend(fontsize=7)
    ax.set_xticks(range(len(arms)), arms, rotation=15, fontsize=7)
    ax.set_ylabel("final held-out loss, dense attention (nats/byte)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_dense_groups(curves: dict[int, list[tuple[float, float]]], lower: set[int], separation: int | None,
                      path: str, title: str) -> None:
    """Every dense seed's held-out loss against steps, lower group in blue, upper in grey, and the separation
    step: where and how the seeds part."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for seed, curve in sorted(curves.items()):
        steps, losses = zip(*curve[1:])  # from the second validation: step 1 sits far above the rest
        group = "lower" if seed in lower else "upper"
        color = "tab:blue" if group == "lower" else "dimgrey"
        ax.plot(steps, losses, "-o", ms=2.5, lw=1, color=color, label=f"seed {seed} ({group})")
        ax.annotate(str(seed), (steps[-1], losses[-1]), fontsize=7, xytext=(4, 0), textcoords="offset points")
    if separation is not None:
        ax.axvline(separation, color="tab:blue", ls=":", lw=0.8, label=f"separated from step {separation}")
    save_figure(fig, ax, "step", "held-out loss, dense attention (nats/byte)", path, title)


def save_figure(fig, ax, xlabel: str, ylabel: str, path: str, title: str) -> None:
    """Label the axes, title and legend (small: many seeds) of a study plot, save it as a PNG and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # an empty plot (nothing placed yet) has no legend
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
