"""Time to quality: held-out loss against training seconds for dense and Lighthouse -> dense arms.

An arm's folders (scripts/time_to_quality.sh): `dense_s<seed>`; `<selection>_s<seed>` (stage 1) and
`<selection>_s<seed>_switch<step>` (stage 2, resumed from stage 1's checkpoint at <step>); a stage-1 variant
adds suffixes (`_k2048from250`: k = 2048 from step 250 on; `_every4`, `_k1024`, `_dl0-7`: see
`recipe.experiments.payoff_grid`), a stage-2 variant one after the switch (`_rewarm36`: an LR re-warm over 36 steps).
Each folder's
metrics.jsonl holds one record per training step (`time_metrics/end_to_end(s)`, logged every step) and the
dense-shadow validation records (`validation/dense_loss`, also during stage 1).

The exchange rate says what a stage-1 step is worth in dense steps. Read where the dense curve of the same
seed (loss against steps, linear between validation points) first reaches a loss: at the switch from the
stage-1 weights' dense-shadow loss (`exchange_rate_at_switch` = those dense steps / switch step) and at the end
from the arm's final loss (`exchange_rate_landing` = (those dense steps - the arm's own dense steps) / its
stage-1 steps). A stage-1 step pays off where the exchange rate times the stage-1 per-step speedup exceeds 1.
The dense curve's points before its last are at a higher learning rate than any run's end, so the landing
rate reads in Lighthouse's favour.

Training seconds, the same rule for every arm: the sum of the per-step times, where the first step of every
training process (Triton and cuDNN warm-up, lazy initialisation) counts as that process's median step. The
per-step time runs from the previous log to this one; validation resets that clock and checkpoints are saved
only on validation steps, so neither evaluation nor saving is counted.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from eval.checkpoint_record import recorded_job
from recipe.logs.layout import CONFIG_FILE, METRICS_FILE, RUN_FILE, RUNS_FOLDER, read_metrics

STEP_TIME = "time_metrics/end_to_end(s)"
DENSE_LOSS = "validation/dense_loss"
DENSE_BITS_PER_BYTE = "validation/dense_bits_per_byte"  # comparable across tokenizers (recipe/train/validation.py)
LIGHTHOUSE_LOSS = "validation/lighthouse_loss"
ARMS_COMMAND = "scripts/time_to_quality.sh (configs/time_to_quality/tiny_64k.toml)"
_FOLDER = re.compile(
    r"(?P<selection>dense|paper|causal|strict)_s(?P<seed>\d+)(?P<variant>(?:_(?!switch)[a-z]+[0-9a-z-]*)*)"
    r"(?:_switch(?P<switch>\d+)(?P<stage2>_rewarm\d+)?)?")


def arm_label(name: str) -> str:
    """A run's arm: its folder or record name without the seed (`dense_s3` -> `dense`)."""
    return re.sub(r"_s\d+(?=_|$)", "", name, count=1)


def step_seconds(records: list[dict]) -> dict[int, float]:
    """Training seconds of each step of one folder, by the module's rule (last record of a step wins)."""
    processes: list[list[dict]] = [[]]
    for r in records:
        if r.get("event") == "run_start":
            processes.append([])
        elif STEP_TIME in r:
            processes[-1].append(r)
    seconds = {}
    for steps in filter(None, processes):
        typical = statistics.median(r[STEP_TIME] for r in steps[1:]) if len(steps) > 1 else steps[0][STEP_TIME]
        seconds.update({r["step"]: typical if i == 0 else r[STEP_TIME] for i, r in enumerate(steps)})
    return seconds


def validation_losses(records: list[dict], key: str = DENSE_LOSS) -> dict[int, float]:
    """The held-out loss `key` of every validated step."""
    return {r["step"]: r[key] for r in records if key in r}


def final_validation_loss(folder: Path) -> float | None:
    """The held-out loss of the last validated step of the run in `folder`; None when it validated none."""
    losses = validation_losses(read_metrics(str(folder / METRICS_FILE), events=True))
    return losses[max(losses)] if losses else None


@dataclass
class Arm:
    """One arm: the steps it trained (stage 1 up to the switch, then stage 2) and its held-out curve."""

    name: str
    selection: str
    seed: int
    switch_step: int | None
    total_steps: int
    seconds: dict[int, float] = field(repr=False)
    losses: dict[int, float] = field(repr=False)
    lighthouse_losses: dict[int, float] = field(default_factory=dict, repr=False)
    """Stage 1's held-out loss under its own Lighthouse attention (the dense-shadow validator's second score)."""
    final_bits_per_byte: float | None = None
    """The last step's held-out dense loss in bits per UTF-8 byte (None in runs logged before that metric)."""
    dense_layers: list[int] | None = None
    """Stage 1's `[lighthouse] dense_layers`, from its run record (None: a dense arm, or a run without a record)."""
    topk: int | None = None
    """Stage 1's `[lighthouse] topk`, from the same record (None where `dense_layers` is)."""
    commits: tuple[str, ...] = ()
    """The commits of the trees that trained it, from its run records, oldest first (empty: no record)."""
    cards: tuple[str, ...] = ()
    """The cards its process starts trained on, from its run records, in order of first use (empty: none named)."""

    @property
    def label(self) -> str:
        """The arm without its seed (`causal_switch360_rewarm36`): the runs of one arm over seeds share it."""
        return arm_label(self.name)

    @property
    def train_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def curve(self) -> list[tuple[float, float]]:
        """[train_seconds at step s, held-out dense loss at s] for every validated step, in order."""
        points, elapsed, done = [], 0.0, 0
        for step in sorted(self.losses):
            elapsed += sum(self.seconds[s] for s in range(done + 1, step + 1))
            done = step
            points.append((elapsed, self.losses[step]))
        return points

    @property
    def step_curve(self) -> list[tuple[float, float]]:
        """[step, held-out dense loss] for every validated step, in order."""
        return [(float(step), self.losses[step]) for step in sorted(self.losses)]

    @property
    def stage1_seconds(self) -> float:
        return sum(self.seconds[s] for s in range(1, (self.switch_step or 0) + 1))

    @property
    def final_loss(self) -> float:
        return self.losses[self.total_steps]

    def median_step(self, lighthouse: bool) -> float:
        """Median step time of the Lighthouse (stage 1) or dense steps of this arm."""
        limit = self.switch_step or 0
        steps = [t for s, t in self.seconds.items() if (s <= limit) == lighthouse]
        return statistics.median(steps)


def stage1_name(folder: str) -> str:
    """The run folder of the stage 1 that the stage-2 folder `folder` resumes (`causal_s0_every4` for
    `causal_s0_every4_switch360_rewarm36`); any other folder is its own stage 1 (a dense arm)."""
    match = _FOLDER.fullmatch(folder)
    if match is None or match["switch"] is None:
        return folder
    return f"{match['selection']}_s{match['seed']}{match['variant'] or ''}"


def load_arms(run: Path, incomplete: list[str] | None = None) -> list[Arm]:
    """Every complete arm under `run` (dense arms and each stage-2 folder with its stage 1). A folder whose steps
    are not all logged, whose last step was not validated or (stage 2) that trained no step raises ValueError, or with
    `incomplete` given is
    named there and left out (a study stopped midway reports what finished)."""
    arms = []
    for folder in sorted(p for p in run.iterdir() if (p / METRICS_FILE).is_file()):
        match = _FOLDER.fullmatch(folder.name)
        if match is None or (match["selection"] != "dense" and match["switch"] is None):
            continue
        records = read_metrics(str(folder / METRICS_FILE), events=True)
        seconds, losses, lighthouse, switch = step_seconds(records), validation_losses(records), {}, None
        stage1_folder = run / stage1_name(folder.name)
        if match["switch"] is not None:
            switch = int(match["switch"])
            stage1 = read_metrics(str(stage1_folder / METRICS_FILE), events=True)
            seconds = {**{s: t for s, t in step_seconds(stage1).items() if s <= switch}, **seconds}
            losses = {**{s: v for s, v in validation_losses(stage1).items() if s <= switch}, **losses}
            lighthouse = {s: v for s, v in validation_losses(stage1, LIGHTHOUSE_LOSS).items() if s <= switch}
        total = max(seconds)
        never_resumed = switch is not None and total <= switch  # a stage 2 that trained no step
        if never_resumed or sorted(seconds) != list(range(1, total + 1)) or total not in losses:
            if incomplete is not None:
                incomplete.append(folder.name)
                continue
            raise ValueError(f"{folder}: steps 1..{total} are not all logged, or the last step was not validated")
        commits, cards = (tuple(dict.fromkeys(recorded_starts(stage1_folder, key) + recorded_starts(folder, key)))
                          for key in ("commit", "card"))
        arms.append(Arm(folder.name, match["selection"], int(match["seed"]), switch, total, seconds, losses, lighthouse,
                        validation_losses(records, DENSE_BITS_PER_BYTE).get(total), *recorded_stage1(stage1_folder),
                        commits, cards))
    return arms


def recorded_starts(folder: Path, key: str) -> list[str]:
    """`key` (`commit`, `card`) of each process start in `folder`'s run records, oldest first, where the record
    names it: a run folder of a queue that went on over several trees or machines names each."""
    starts = [json.loads((p / RUN_FILE).read_text()) for p in sorted((folder / RUNS_FOLDER).glob("*"))
              if (p / RUN_FILE).is_file()]
    return [start[key] for start in starts if start.get(key)]


def recorded_stage1(folder: Path) -> tuple[list[int] | None, int | None]:
    """`[lighthouse] dense_layers` and `topk` of the job in `folder` as its first run record has them, the two
    settings a stage-1 arm varies; None for a dense job or a folder without a record."""
    records = sorted(p for p in (folder / RUNS_FOLDER).glob("*") if (p / CONFIG_FILE).is_file())
    if not records:
        return None, None
    lighthouse = recorded_job(records[0]).lighthouse
    return (list(lighthouse.dense_layers), lighthouse.topk) if lighthouse.enable else (None, None)


def seconds_to_reach(curve: list[tuple[float, float]], loss: float) -> float | None:
    """First training second at which a curve reaches `loss`, linear between validation points; None if never."""
    if curve and curve[0][1] <= loss:
        return curve[0][0]
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= loss:  # and l0 > loss: the earlier points are all above
            return t0 + (t1 - t0) * (l0 - loss) / (l0 - l1)
    return None


def exchange_rates(arm: Arm, dense: Arm) -> dict:
    """The dense steps a stage-1 step of `arm` is worth, at the switch and where the arm lands (module doc), the
    stage-1 weights' dense-shadow gaps at the switch, and the stage-1 per-step speedups."""
    switch = arm.switch_step
    shadow = arm.losses[switch]
    at_switch = seconds_to_reach(dense.step_curve, shadow)
    landing = seconds_to_reach(dense.step_curve, arm.final_loss)
    dense_step = statistics.mean(dense.seconds.values())
    rates = {
        "exchange_rate_at_switch": None if at_switch is None else round(at_switch / switch, 4),
        "exchange_rate_landing": None if landing is None else round((landing - (arm.total_steps - switch)) / switch, 4),
        "shadow_minus_dense_at_switch": round(shadow - dense.losses[switch], 4) if switch in dense.losses else None,
        "stage1_step_speedup": round(dense.median_step(False) / arm.median_step(True), 4),
        "stage1_mean_step_speedup": round(dense_step * switch / arm.stage1_seconds, 4),
    }
    if switch in arm.lighthouse_losses:
        rates["shadow_minus_lighthouse_at_switch"] = round(shadow - arm.lighthouse_losses[switch], 4)
    return rates


def arm_record(arm: Arm, dense: Arm | None, seq_len: int, device: str) -> dict:
    """The docs/records/time_to_quality.json object of an arm, with its time-to-quality speedup and exchange rates
    against `dense`."""
    record = {"name": "dense" if arm.name == "dense_s0" else arm.name, "selection": arm.selection,
              "switch_step": arm.switch_step, "dense_layers": arm.dense_layers, "topk": arm.topk,
              "total_steps": arm.total_steps, "seq_len": seq_len, "seed": arm.seed, "device": device,
              "train_seconds": round(arm.train_seconds, 3), "final_heldout_loss": arm.final_loss,
              "curve": [[round(t, 3), v] for t, v in arm.curve],
              "step_curve": [[int(step), v] for step, v in arm.step_curve]}
    if arm.final_bits_per_byte is not None:
        record["final_bits_per_byte"] = arm.final_bits_per_byte
    if arm.lighthouse_losses:
        record["stage1_lighthouse_curve"] = [[s, v] for s, v in sorted(arm.lighthouse_losses.items())]
    if dense is not None and arm.switch_step is not None:  # a Lighthouse -> dense arm, against its seed's dense run
        record.update(time_to_quality(dense.curve, arm.final_loss, arm.train_seconds))
        record.update(exchange_rates(arm, dense))
    return record


def run_folder(name: str, seed: int) -> str:
    """The folder (and per-token dump) name of the record `name` of `seed`: `arm_record` names seed 0's dense run
    plain `dense`."""
    return f"dense_s{seed}" if name == "dense" else name


def time_to_quality(dense_curve: list[tuple[float, float]], loss: float, seconds: float) -> dict:
    """The seconds the dense curve needs to first reach `loss`, and that over the arm's `seconds` (None: never)."""
    reach = seconds_to_reach(dense_curve, loss)
    return {"dense_seconds_to_this_loss": None if reach is None else round(reach, 3),
            "time_to_quality_speedup": None if reach is None else round(reach / seconds, 4)}


def against_earlier_dense(records: list[dict], earlier: list[dict]) -> list[dict]:
    """`records` whose seed has no dense run among them get their time to quality against the dense record of that
    seed in `earlier` (same device only: seconds on other cards do not compare), marked `dense_from: earlier`."""
    here = {r["seed"] for r in records if arm_label(r["name"]) == "dense"}
    dense = {r["seed"]: r for r in earlier if arm_label(r["name"]) == "dense" and "curve" in r}
    out = []
    for r in records:
        d = dense.get(r["seed"])
        if r["selection"] != "dense" and r["seed"] not in here and d is not None and d["device"] == r["device"]:
            r = {**r, **time_to_quality(d["curve"], r["final_heldout_loss"], r["train_seconds"]),
                 "dense_from": "earlier"}
        out.append(r)
    return out


def recorded_device(arm: Arm) -> str:
    """The card(s) `arm`'s run records name, as a record's `device` ("unknown" where none does)."""
    return " + ".join(arm.cards) or "unknown"


def report_records(arms: list[Arm], seq_len: int, device: str | None, commit: str, command: str = ARMS_COMMAND
                   ) -> list[dict]:
    """The docs/records/time_to_quality.json list: each arm's record against the dense arm of its seed, with the commit
    of the tree that ran it (its run records' newest, `commits` all of them where several trees did; `commit` for an
    arm without records), the `cards` its run records name, its `device` (the label given, else those cards) and the
    command that ran them."""
    dense = {a.seed: a for a in arms if a.label == "dense"}  # not a frontier run (`dense_s<seed>_steps<n>`)
    return [{**arm_record(a, dense.get(a.seed), seq_len, device if device is not None else recorded_device(a)),
             "commit": a.commits[-1] if a.commits else commit,
             **({"commits": list(a.commits)} if len(a.commits) > 1 else {}),
             **({"cards": list(a.cards)} if a.cards else {}), "command": command} for a in arms]


def markdown_table(records: list[dict]) -> str:
    """One row per arm: seed, switch step, training seconds, final held-out loss, the speedups and the exchange
    rates."""
    rows = ["| arm | seed | switch | train s | final held-out | dense s to that loss | time-to-quality speedup | "
            "stage-1 step speedup | exchange rate at switch | exchange rate landing |", "|" + "---|" * 10]

    def cell(r: dict, key: str) -> str:
        return "-" if key not in r else "none" if r[key] is None else str(r[key])

    for r in records:
        reach = r.get("dense_seconds_to_this_loss", "-")
        rows.append(f"| {r['name']} | {r['seed']} | {r['switch_step'] or '-'} | {r['train_seconds']:.1f} | "
                    f"{r['final_heldout_loss']:.4f} | {'never' if reach is None else reach} | "
                    f"{cell(r, 'time_to_quality_speedup')} | {cell(r, 'stage1_step_speedup')} | "
                    f"{cell(r, 'exchange_rate_at_switch')} | {cell(r, 'exchange_rate_landing')} |")
    return "\n".join(rows)


def plot_curves(arms: list[Arm], path: str, title: str) -> None:
    """Held-out dense loss against training seconds, one line per arm (switch points marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = {"dense": "black", "paper": "tab:red", "causal": "tab:blue"}
    variant_colors = iter(["tab:green", "tab:orange", "tab:purple", "tab:brown"])
    for arm in arms:
        t, v = zip(*arm.curve)
        late_switch = arm.switch_step is not None and 2 * arm.switch_step > arm.total_steps
        variant = _FOLDER.fullmatch(arm.name)["variant"]
        if variant and variant not in colors:
            colors[variant] = next(variant_colors)
        color = colors[variant or arm.selection]
        ax.plot(t, v, "-" if arm.seed == 0 else ":", marker="^" if late_switch else "o", ms=3, color=color,
                label=arm.name)
        if arm.switch_step:
            ax.axvline(arm.stage1_seconds, color=color, lw=0.4, alpha=0.4)
    ax.set_xlabel("training seconds (steps only)")
    ax.set_ylabel("held-out loss, dense attention (nats/byte)")
    low = min(v for arm in arms for _, v in arm.curve)
    ax.set_ylim(low - 0.05, low + 0.6)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_steps(arms: list[Arm], path: str, title: str) -> None:
    """Held-out dense loss against steps, one panel per seed; stage 1's own Lighthouse loss dashed, so the
    dense-shadow gap and where each arm lands on the dense curve can be read off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({a.seed for a in arms})
    fig, axes = plt.subplots(1, len(seeds), figsize=(6 * len(seeds), 4.5), sharey=True, squeeze=False)
    low = min(v for arm in arms for _, v in arm.step_curve)
    for ax, seed in zip(axes[0], seeds):
        for color, arm in zip(["black", "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown"],
                              sorted((a for a in arms if a.seed == seed), key=lambda a: a.selection != "dense")):
            steps, losses = zip(*arm.step_curve)
            ax.plot(steps, losses, "-o", ms=2.5, color=color, label=arm.name)
            if arm.lighthouse_losses:
                ax.plot(*zip(*sorted(arm.lighthouse_losses.items())), "--", lw=0.9, color=color,
                        label=f"{arm.name}: stage 1, own Lighthouse loss")
                ax.axvline(arm.switch_step, color=color, lw=0.4, alpha=0.5)
        ax.set_xlabel("step")
        ax.set_title(f"seed {seed}", fontsize=9)
        ax.set_ylim(low - 0.05, low + 0.6)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("held-out loss, dense attention (nats/byte)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
