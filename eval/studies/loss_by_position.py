"""Loss by position in a context-extension study, at matched compute: what training at the long length bought where
stage 0 (dense at a shorter length) never looked, at positions past `stage0_seq_len`.

Input: each scored model's mean loss in each position class (`eval.metrics.loss_anatomy.position_classes`, stage
0's length among the edges) and past stage 0 (every position >= `stage0_seq_len`), taken from its per-token
held-out losses (`scripts/loss_anatomy.py dump`, the same windows for every model) by `model_class_losses`, or
from its record's `position_losses` where an earlier report took them; and the study's run records. Per
Lighthouse -> dense arm and class: the arm's mean loss minus its seed's dense frontier *of that class* at the
arm's dense-equivalent steps (the class's mean loss of the seed's dense runs of each length, linear between
neighbouring lengths, `eval.studies.frontier`; None outside its lengths), and minus the seed's dense run of the
study's length (matched steps); then their means over seeds. Descriptive: no verdict.
"""
from __future__ import annotations

import statistics

import numpy as np

from eval.metrics.loss_anatomy import position_classes, position_edges
from eval.studies.frontier import dense_equivalent_steps, frontiers, loss_at
from eval.studies.payoff import bootstrap_interval, interval_text, rounded_interval
from eval.studies.time_to_quality import arm_label, run_folder

PAST = "past stage 0"


def position_masks(length: int, stage0_seq_len: int) -> dict[str, np.ndarray]:
    """Masks [length] of every position class, stage 0's length an edge, and of the positions past stage 0."""
    masks = position_classes(length, position_edges(stage0_seq_len))
    masks[PAST] = np.arange(length) >= stage0_seq_len
    return masks


def class_losses(losses: dict[str, np.ndarray], masks: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Each model's mean per-token loss (losses [W, T]) in every class of `masks` [T]."""
    return {name: {cls: float(loss[:, mask].mean(dtype=np.float64)) for cls, mask in masks.items()}
            for name, loss in losses.items()}


def model_class_losses(losses: dict[str, np.ndarray], stage0_seq_len: int) -> dict[str, dict[str, float]]:
    """Each model's mean per-token loss (losses [W, T], one T for all) in every position class and past stage 0."""
    if not losses:
        return {}
    return class_losses(losses, position_masks(next(iter(losses.values())).shape[1], stage0_seq_len))


def class_frontier(front: list[dict], classes: dict[str, dict[str, float]], cls: str) -> list[dict]:
    """One class's frontier of a seed, for `eval.studies.frontier.loss_at`: {steps, loss} of each of its dense runs
    (`front`: {steps, name}, shortest first) with the class's mean loss of that run (`classes`: name -> class ->
    loss)."""
    return [{"steps": p["steps"], "loss": classes[p["name"]][cls]} for p in front]


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def read_out(records: list[dict], scored: dict[str, dict[str, float]], stage0_seq_len: int, validation_freq: int,
             lengths: int) -> dict:
    """The loss by position of every scored model (`scored`: run folder -> position class -> mean loss, not empty)
    with a record, and every scored Lighthouse arm against its seed's per-class frontier (seeds whose scored dense
    runs span `lengths` lengths, as `eval.studies.frontier.place` asks) and against its seed's dense run. ValueError
    where two models' classes differ (dumps of other lengths or another stage 0)."""
    named = {run_folder(r["name"], r["seed"]): r for r in records}
    classes = {n: row for n, row in scored.items() if n in named}
    kinds: dict[tuple[str, ...], list[str]] = {}
    for name, row in classes.items():
        kinds.setdefault(tuple(row), []).append(name)
    if len(kinds) > 1:
        raise ValueError("models are scored in different position classes: " + "; ".join(
            f"{sorted(models)} in {list(names)}" for names, models in kinds.items()))
    names = list(next(iter(kinds), ()))
    fronts = {}
    for seed, front in frontiers(records).items():
        runs = [{"steps": p["steps"], "name": name} for p in front if (name := run_folder(p["name"], seed)) in classes]
        if len(runs) >= lengths:
            fronts[seed] = runs
    arms: dict[str, dict] = {}
    for name in sorted(classes, key=lambda n: (arm_label(n), named[n]["seed"])):
        r = named[name]
        if r["selection"] == "dense":
            continue
        steps, dense = dense_equivalent_steps(r, validation_freq), classes.get(f"dense_s{r['seed']}")
        row = {"name": name, "dense_equivalent_steps": steps, "classes": {}}
        for cls, loss in classes[name].items():
            at = loss_at(class_frontier(fronts[r["seed"]], classes, cls), steps) if r["seed"] in fronts else None
            row["classes"][cls] = {"loss": loss, "frontier": at, "difference": None if at is None else loss - at,
                                   "minus_dense": None if dense is None else loss - dense[cls]}
        arms.setdefault(arm_label(name), {"seeds": {}})["seeds"][r["seed"]] = row
    for entry in arms.values():
        entry["matched_compute"], entry["matched_steps"] = {}, {}
        for cls in names:
            diffs = [d for row in entry["seeds"].values() if (d := row["classes"][cls]["difference"]) is not None]
            interval = bootstrap_interval(diffs)
            entry["matched_compute"][cls] = {
                "n": len(diffs), "mean_difference": _mean(diffs), "below_zero": sum(d < 0 for d in diffs),
                "interval95": rounded_interval(interval)}
            minus = [d for row in entry["seeds"].values() if (d := row["classes"][cls]["minus_dense"]) is not None]
            entry["matched_steps"][cls] = {"n": len(minus), "mean_difference": _mean(minus)}
    models: dict[int, dict[str, dict[str, float]]] = {}
    for name in sorted(classes, key=lambda n: (named[n]["seed"], named[n]["selection"] != "dense", n)):
        models.setdefault(named[name]["seed"], {})[name] = classes[name]
    return {"stage0_seq_len": stage0_seq_len, "classes": names, "models": models, "frontiers": fronts,
            "arms": arms}


def _signed(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def markdown(read: dict) -> str:
    """Every model's loss per position class by seed, then each arm's differences per class at matched compute
    (against the per-class frontier) and at matched steps (against dense), per seed and as means over seeds."""
    classes = read["classes"]
    lines = [f"Loss by position (mean per-token loss; \"{PAST}\": positions >= {read['stage0_seq_len']:,}, the "
             "length of stage 0):", "", "| seed | model | " + " | ".join(classes) + " |",
             "|---|---|" + "---|" * len(classes)]
    for seed, models in read["models"].items():
        lines += [f"| {seed} | {name} | " + " | ".join(f"{row[c]:.4f}" for c in classes) + " |"
                  for name, row in models.items()]
    lines += ["", "Per position class, each arm minus its seed's dense frontier of that class at the arm's "
              "dense-equivalent steps (matched compute), and minus its seed's dense run (matched steps):", "",
              "| arm | class | seeds | arm - frontier, per seed | mean | 95% bootstrap interval | below 0 | "
              "arm - dense, per seed | mean |", "|---|---|---|---|---|---|---|---|---|"]
    for arm, entry in read["arms"].items():
        seeds = ",".join(map(str, entry["seeds"]))
        for cls in classes:
            rows = [row["classes"][cls] for row in entry["seeds"].values()]
            compute, steps = entry["matched_compute"][cls], entry["matched_steps"][cls]
            interval = interval_text(compute["interval95"])
            lines.append(f"| {arm} | {cls} | {seeds} | {' '.join(_signed(r['difference']) for r in rows)} | "
                         f"{_signed(compute['mean_difference'], 4)} | {interval} | "
                         f"{compute['below_zero']}/{compute['n']} | {' '.join(_signed(r['minus_dense']) for r in rows)}"
                         f" | {_signed(steps['mean_difference'], 4)} |")
    return "\n".join(lines)


def plot(read: dict, path: str, title: str) -> None:
    """Per position class, each arm minus its seed's dense run (matched steps, left) and minus its seed's per-class
    frontier at its dense-equivalent steps (matched compute, right): one thin line a seed, the mean over seeds bold;
    "past stage 0" (the union of the classes from stage 0's length on) stands apart at the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = read["classes"]
    spans = [i for i, cls in enumerate(classes) if cls != PAST]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key, view in ((axes[0], "minus_dense", "matched steps: arm - dense"),
                          (axes[1], "difference", "matched compute: arm - frontier")):
        for i, (arm, entry) in enumerate(read["arms"].items()):
            color = colors[i % len(colors)]
            for row in entry["seeds"].values():
                values = [np.nan if (v := row["classes"][cls][key]) is None else v for cls in classes]
                ax.plot(spans, [values[j] for j in spans], "-", color=color, lw=0.7, alpha=0.4)
                ax.plot([len(classes) - 1], [values[-1]], "s", color=color, ms=3, alpha=0.4)
            summary = entry["matched_steps" if key == "minus_dense" else "matched_compute"]
            means = [np.nan if (m := summary[cls]["mean_difference"]) is None else m for cls in classes]
            if np.isnan(means).all():
                continue
            n = summary[classes[-1]]["n"]
            ax.plot(spans, [means[j] for j in spans], "-o", color=color, lw=2, ms=4,
                    label=f"{arm}, mean of {n} seed{'' if n == 1 else 's'}")
            ax.plot([len(classes) - 1], [means[-1]], "s", color=color, ms=7)
        if not ax.get_legend_handles_labels()[0]:
            ax.text(0.5, 0.5, "no seed placed yet", transform=ax.transAxes, ha="center", color="grey")
        else:
            ax.legend(fontsize=7)
        ax.axhline(0.0, color="black", lw=0.6)
        ax.axvline(len(classes) - 1.5, color="grey", ls=":", lw=0.8)
        ax.set_xticks(range(len(classes)), classes)
        ax.set_title(view, fontsize=9)
        ax.set_xlabel("position class (tokens)")
    axes[0].set_ylabel("difference in mean per-token loss (nats/byte)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
