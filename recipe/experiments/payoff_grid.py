"""The pay-off map's study: which runs a study TOML asks for, and the `train.py` calls that train them.

A study file (`configs/payoff/*.toml`) names one job config, the seeds, and one or more `[[grid]]` blocks; each
block is the product of its values, the study the union of the blocks:

    [study]
    config = "configs/time_to_quality/tiny_128k.toml"   # every run's job config
    run = "outputs/payoff/tiny_128k"                     # one folder per run, the queue's logs, the report
    corpus = "outputs/payoff/corpus"                     # <corpus>/train and <corpus>/heldout
    corpus_sources = ["lighthouse", "recipe"]            # optional: `run` builds a missing corpus from these folders
    corpus_digest = "f4eb804e"                           # optional: `run` refuses a corpus whose digest differs
    steps = 720                                          # every run's steps, on one LR schedule
    warmup_steps = 72
    seeds = [0, 1, 2, 3]
    dense = true                                         # a dense run of every seed of a block: the reference
    frontier = [600, 510, 400]                           # dense runs whose whole schedule ends sooner (optional)
    stage0_seq_len = 8192                                # optional: context extension from a short dense stage 0
    stage0_steps = 720
    stage0_deterministic = true                          # optional: stage 0 in torchtitan's deterministic mode

    [[grid]]
    topk = [1024, 2048]           # default: the config's        (stage 1)
    dense_layers = [[0, 7], []]   # default: the config's        (stage 1)
    selection = ["causal"]        # default: the config's        (stage 1)
    switch = [180, 360]           # default: steps / 2           (the step of the switch to dense attention)
    rewarm_steps = [0, 36]        # default: 0                   (an LR re-warm at the switch)
    seeds = [0, 1]                # default: the study's seeds   (a block on some seeds only)

A block's values are checked at load by the rules train.py applies when their runs start: its selections are names
Lighthouse knows, its dense_layers fit the model, and each topk, with the config's other `[lighthouse]` settings
(`LighthouseConfig`'s defaults where it omits one), fits its `training.seq_len` (`lighthouse/config_rules.py`).

Runs of one seed that differ only after the switch share one stage-1 run, trained to the last switch any of
them needs (checkpoints at the config's interval must fall on every switch). Folder names follow
`eval.studies.time_to_quality`: `dense_s<seed>`; stage 1 `<selection>_s<seed>` plus `_k<topk>` and
`_dl<layers joined by ->` (`_dlnone`: no dense layer) where they differ from the config; stage 2 that plus
`_switch<step>` and `_rewarm<steps>`. The report's optional keys: `group_threshold` (the final loss below
which a run is in the lower group), `baseline` (the arm that the other Lighthouse arms are paired with),
`anatomy_windows` and `niah_lengths` (the per-token analysis of every seed's final models, in an extension study
its frontier runs too); `reported` (names of dense, frontier or stage-2 runs whose results come from earlier
records joined with `report --include`: not queued again, while the stage-1 runs that other arms resume still
are).

`frontier` is the time-matched dense reference: for every seed, one dense run per length, named
`dense_s<seed>_steps<n>`, whose LR schedule is the study's scaled to n steps (warm-up `warmup_steps * n / steps`,
then the config's decay to its end), validated and saved at its last step only, so its timed steps are
undisturbed and its score is the final held-out loss. Each seed's frontier runs follow its dense run, longest
first. With `steps` itself, they give each seed's final loss against training seconds (`eval.studies.frontier`).

`stage0_seq_len` and `stage0_steps` make the study one of context extension: for every seed, a dense run at the
short length (`stage0_s<seed>`, its own schedule scaled as a frontier run's) trains first, and every stage-1,
dense and frontier run of that seed starts from its final weights (model only: a fresh optimizer and schedule).
Its report gives the loss by position, past `stage0_seq_len` too, at matched compute
(`eval.studies.loss_by_position`). With `stage0_deterministic = true` stage 0 trains with `--debug.deterministic`
(no `warn_only`), so that a seed continued on another machine trains its stage 0 again to the same weights.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from models.flavor_shapes import FLAVOR_SHAPES
from recipe.toml_config import get_key, load_toml

STUDY_KEYS = {"config", "run", "corpus", "steps", "warmup_steps", "seeds", "dense", "group_threshold", "baseline",
              "anatomy_windows", "niah_lengths", "reported", "frontier", "corpus_sources",
              "stage0_seq_len", "stage0_steps", "stage0_deterministic", "corpus_digest"}
GRID_KEYS = {"selection", "topk", "dense_layers", "switch", "rewarm_steps", "seeds"}


def _lighthouse_config_rules() -> ModuleType:
    """`lighthouse.config_rules` (the rules, defaults and names of `LighthouseConfig`'s settings), from its file run
    on its own: importing `lighthouse.config_rules` would run the package's `__init__`, which imports torch, and
    `tasks` plans a study without torch."""
    folder = importlib.util.find_spec("lighthouse").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("lighthouse_config_rules", Path(folder) / "config_rules.py")
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    return rules


RULES = _lighthouse_config_rules()


def _lighthouse_setting(base: dict[str, Any], name: str) -> Any:
    """The job config's `[lighthouse] <name>`, or `LighthouseConfig`'s default (train.py's too) where it has none."""
    return get_key(base, f"lighthouse.{name}", RULES.DEFAULTS[name])


@dataclass(frozen=True)
class Stage1:
    selection: str
    topk: int
    dense_layers: tuple[int, ...]
    seed: int
    name: str


@dataclass(frozen=True)
class Run:
    """One training process of the study: `kind` stage0 (dense at the short length of an extension study), dense,
    frontier (dense on a schedule of its own length), stage1 or stage2 (resuming `stage1` at `switch`)."""

    name: str
    kind: str
    seed: int
    stage1: Stage1 | None = None
    switch: int = 0
    rewarm_steps: int = 0
    steps: int = 0
    after: tuple[str, ...] = ()


@dataclass
class Study:
    path: Path
    config: str
    run: Path
    corpus: Path
    steps: int
    warmup_steps: int
    seeds: list[int]
    dense: bool
    grid: list[dict[str, list[Any]]]
    base: dict[str, Any] = field(repr=False)
    group_threshold: float | None = None
    baseline: str | None = None
    anatomy_windows: int = 0
    niah_lengths: list[int] = field(default_factory=list)
    reported: list[str] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)
    corpus_sources: list[Path] = field(default_factory=list)
    corpus_digest: str | None = None  # a prefix of `recipe.experiments.corpus.corpus_digest`'s hex digest
    stage0_seq_len: int = 0  # 0: no stage 0, every run starts from initial weights
    stage0_steps: int = 0
    stage0_deterministic: bool = False


def _fail(path: Path, message: str) -> ValueError:
    return ValueError(f"{path}: {message}")


def _is_int(value: Any) -> bool:
    """Whether a TOML value is an integer (TOML's true and false are Python ints too)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(path: Path, key: str, value: Any, minimum: int) -> list[int]:
    if not isinstance(value, list) or not value or not all(_is_int(v) and v >= minimum for v in value):
        raise _fail(path, f"{key} = {value!r} must be a non-empty list of integers >= {minimum}")
    if len(set(value)) != len(value):
        raise _fail(path, f"{key} = {value!r} repeats a value")
    return value


def _check_values(path: Path, study: dict) -> None:
    """The `[study]` values whose type alone can be wrong: paths are non-empty strings, `warmup_steps` a count,
    `dense` true or false, `group_threshold` a finite number and `baseline` a run name (a wrong one ended in a
    traceback, or was taken as something else: "yes" for true, a negative warm-up)."""
    for key in ("config", "run", "corpus"):
        if not isinstance(study[key], str) or not study[key]:
            raise _fail(path, f"study.{key} = {study[key]!r} must be a non-empty path")
    if "warmup_steps" in study and not (_is_int(study["warmup_steps"]) and study["warmup_steps"] >= 0):
        raise _fail(path, f"study.warmup_steps = {study['warmup_steps']!r} must be an integer >= 0")
    if not isinstance(study.get("dense", True), bool):
        raise _fail(path, f"study.dense = {study['dense']!r} must be true or false")
    threshold = study.get("group_threshold")
    if threshold is not None and not (isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
                                      and math.isfinite(threshold)):
        raise _fail(path, f"study.group_threshold = {threshold!r} must be a finite number (a held-out loss)")
    if not isinstance(study.get("baseline", ""), str):
        raise _fail(path, f"study.baseline = {study['baseline']!r} must be a run name")


def load_study(path: Path) -> Study:
    """The study of a TOML file; ValueError naming the file, the key and the value of any mistake."""
    try:
        raw = load_toml(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the study file: {err}") from err
    study, blocks = raw.get("study"), raw.get("grid")
    if not isinstance(study, dict) or not isinstance(blocks, list) or not blocks:
        raise _fail(path, "needs a [study] table and at least one [[grid]] block")
    if unknown := sorted(set(raw) - {"study", "grid"}) + sorted(f"study.{k}" for k in set(study) - STUDY_KEYS):
        raise _fail(path, f"unknown keys {unknown}")
    for key in ("config", "run", "corpus", "steps", "seeds"):
        if key not in study:
            raise _fail(path, f"[study] needs {key}")
    _check_values(path, study)
    config = Path(study["config"])
    if not config.is_file():
        raise _fail(path, f"study.config = {str(config)!r} is not a file")
    steps = study["steps"]
    if not _is_int(steps) or steps < 2:
        raise _fail(path, f"study.steps = {steps!r} must be an integer >= 2")
    try:
        base = load_toml(config)
    except (OSError, ValueError) as err:
        raise _fail(path, f"study.config = {str(config)!r} cannot be read as TOML: {err}") from err
    parsed = Study(
        path=path, config=str(config), run=Path(study["run"]), corpus=Path(study["corpus"]), steps=steps,
        warmup_steps=study.get("warmup_steps", get_key(base, "lr_scheduler.warmup_steps", 0)),
        seeds=_int_list(path, "study.seeds", study["seeds"], 0), dense=study.get("dense", True), grid=[], base=base,
        group_threshold=study.get("group_threshold"), baseline=study.get("baseline"),
        anatomy_windows=study.get("anatomy_windows", 0), niah_lengths=study.get("niah_lengths", []),
        reported=study.get("reported", []),
        frontier=_int_list(path, "study.frontier", study["frontier"], 2) if "frontier" in study else [])
    sources = study.get("corpus_sources", [])
    if not isinstance(sources, list) or not all(isinstance(v, str) and v for v in sources):
        raise _fail(path, f"study.corpus_sources = {sources!r} must be a list of folder paths")
    parsed.corpus_sources = [Path(v) for v in sources]
    digest = study.get("corpus_digest")
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{8,64}", digest)):
        raise _fail(path, f"study.corpus_digest = {digest!r} must be 8 to 64 lowercase hex digits (a prefix of "
                          "the corpus's SHA-256 digest)")
    parsed.corpus_digest = digest
    _check_stage0(parsed, study)
    if long := [n for n in parsed.frontier if n >= steps]:
        raise _fail(path, f"study.frontier {long} must be below study.steps = {steps}: a frontier run is a dense run "
                          "whose schedule ends sooner (the dense run of study.dense is study.steps long)")
    interval = get_key(base, "checkpoint.interval", 0)
    for number, block in enumerate(blocks, 1):
        if unknown := sorted(set(block) - GRID_KEYS):
            raise _fail(path, f"[[grid]] block {number} has unknown keys {unknown} (known: {sorted(GRID_KEYS)})")
        axes = {
            "selection": block.get("selection", [_lighthouse_setting(base, "selection")]),
            "topk": _int_list(path, f"grid {number} topk", block.get("topk", [_lighthouse_setting(base, "topk")]), 1),
            "dense_layers": block.get("dense_layers", [get_key(base, "lighthouse.dense_layers", [])]),
            "switch": _int_list(path, f"grid {number} switch", block.get("switch", [steps // 2]), 1),
            "rewarm_steps": _int_list(path, f"grid {number} rewarm_steps", block.get("rewarm_steps", [0]), 0),
            "seeds": _int_list(path, f"grid {number} seeds", block.get("seeds", parsed.seeds), 0),
        }
        if other := [s for s in axes["seeds"] if s not in parsed.seeds]:
            raise _fail(path, f"grid {number} seeds {other} are not among study.seeds = {parsed.seeds}")
        if late := [s for s in axes["switch"] if s >= steps]:
            raise _fail(path, f"grid {number} switch {late} must be below study.steps = {steps}")
        if interval and (off := [s for s in axes["switch"] if s % interval]):
            raise _fail(path, f"grid {number} switch {off} must be multiples of checkpoint.interval = {interval} "
                              f"in {config} (stage 2 resumes the checkpoint saved at the switch)")
        if any(not isinstance(d, list) or not all(_is_int(i) and i >= 0 for i in d) for d in axes["dense_layers"]):
            raise _fail(path, f"grid {number} dense_layers = {axes['dense_layers']!r} must be a list of lists of "
                              "layer indices >= 0")
        _check_selection(path, number, axes["selection"])
        _check_dense_layers(parsed, number, axes["dense_layers"])
        _check_layer_settings(parsed, number, axes["selection"], axes["topk"])
        parsed.grid.append(axes)
    if not parsed.dense and (idle := [s for s in parsed.seeds if not any(s in axes["seeds"] for axes in parsed.grid)]):
        raise _fail(path, f"study.seeds {idle} are in no [[grid]] block's seeds and study.dense = false: nothing "
                          "would run on them")
    _check_per_token_pass(parsed)
    _check_reported(parsed)
    return parsed


def _check_selection(path: Path, number: int, selections: Any) -> None:
    """A block's selections are names `lighthouse.LighthouseConfig` accepts (a typo was refused only when its stage-1
    run started, after the runs queued before it had trained)."""
    allowed = list(RULES.SELECTIONS)
    if not isinstance(selections, list) or not selections or not all(isinstance(s, str) for s in selections):
        raise _fail(path, f"grid {number} selection = {selections!r} must be a non-empty list of names among "
                          f"{allowed}")
    if unknown := [s for s in selections if s not in allowed]:
        raise _fail(path, f"grid {number} selection {unknown} are not among the Lighthouse selections {allowed}")


def _check_dense_layers(study: Study, number: int, choices: list[list[int]]) -> None:
    """Each dense-layer list of a block names each layer once, inside the model of the config's flavor, and leaves
    a layer to run Lighthouse in stage 1, as train.py checks at start-up (the depth of `model.flavor = "hf"`, read
    from a Hugging Face config.json, is left to train.py)."""
    flavor = get_key(study.base, "model.flavor")
    n_layers = FLAVOR_SHAPES[flavor]["n_layers"] if flavor in FLAVOR_SHAPES else None
    model = f"of model.flavor = {flavor!r} in {study.config}"
    for layers in choices:
        if repeated := sorted({i for i in layers if layers.count(i) > 1}):
            raise _fail(study.path, f"grid {number} dense_layers {layers} repeats {repeated}")
        if n_layers is None:
            continue
        if outside := [i for i in layers if i >= n_layers]:
            raise _fail(study.path, f"grid {number} dense_layers {layers} has {outside} outside the {n_layers} "
                                    f"layers (0..{n_layers - 1}) {model}")
        if len(layers) == n_layers:
            raise _fail(study.path, f"grid {number} dense_layers {layers} covers all {n_layers} layers {model}: "
                                    "no layer of stage 1 would run Lighthouse")


def _check_layer_settings(study: Study, number: int, selections: list[str], topks: list[int]) -> None:
    """Every stage-1 layer of a block (each of its selections and topks, with the config's other `[lighthouse]`
    settings) meets the rules `LighthouseConfig` applies when the run starts, at the config's training.seq_len (a
    topk off the tile budget, or whose tiles the coarsest level cannot fill, was refused only then, after the runs
    queued before it had trained)."""
    settings = {name: _lighthouse_setting(study.base, name) for name in RULES.DEFAULTS}
    seq_len = get_key(study.base, "training.seq_len")  # none: torchtitan's default, which train.py checks
    at = "" if seq_len is None else f" at training.seq_len = {seq_len}"
    for selection, topk in itertools.product(selections, topks):
        layer = {**settings, "selection": selection, "topk": topk}
        try:
            RULES.check_settings(**layer)
            if seq_len is not None:
                RULES.check_seq_len(seq_len, layer["levels"], layer["pool"], topk, layer["tile_budget"],
                                    layer["scorer"], layer["dilation"])
        except (TypeError, ValueError) as err:
            raise _fail(study.path, f"grid {number} topk {topk} cannot run with the [lighthouse] settings of "
                                    f"{study.config}{at}: {err}") from err


def _check_stage0(parsed: Study, study: dict) -> None:
    """`stage0_seq_len` and `stage0_steps` come together, the length below the config's `training.seq_len`;
    `stage0_deterministic` only with them."""
    given = [key for key in ("stage0_seq_len", "stage0_steps") if key in study]
    deterministic = study.get("stage0_deterministic", False)
    if not isinstance(deterministic, bool):
        raise _fail(parsed.path, f"study.stage0_deterministic = {deterministic!r} must be true or false")
    if deterministic and not given:
        raise _fail(parsed.path, "study.stage0_deterministic = true needs study.stage0_seq_len and stage0_steps")
    parsed.stage0_deterministic = deterministic
    if not given:
        return
    if len(given) == 1:
        raise _fail(parsed.path,
                    f"study.{given[0]} needs study.stage0_{'steps' if 'seq_len' in given[0] else 'seq_len'}")
    seq_len, steps = study["stage0_seq_len"], study["stage0_steps"]
    long = get_key(parsed.base, "training.seq_len")
    if not _is_int(seq_len) or not 1 <= seq_len < long:
        raise _fail(parsed.path, f"study.stage0_seq_len = {seq_len!r} must be an integer below training.seq_len = "
                                 f"{long} of {parsed.config}")
    if not _is_int(steps) or steps < 2:
        raise _fail(parsed.path, f"study.stage0_steps = {steps!r} must be an integer >= 2")
    parsed.stage0_seq_len, parsed.stage0_steps = seq_len, steps


def _check_per_token_pass(study: Study) -> None:
    """`anatomy_windows` counts held-out windows; NIAH runs inside that pass, at lengths the model's RoPE covers."""
    windows = study.anatomy_windows
    if not _is_int(windows) or windows < 0:
        raise _fail(study.path, f"study.anatomy_windows = {windows!r} must be an integer >= 0")
    if not study.niah_lengths:
        return
    lengths = _int_list(study.path, "study.niah_lengths", study.niah_lengths, 1)
    if not windows:
        raise _fail(study.path, f"study.niah_lengths = {lengths} needs study.anatomy_windows > 0: NIAH runs in "
                                "the per-token pass of each seed's final models")
    seq_len = get_key(study.base, "training.seq_len")
    if seq_len and (long := [n for n in lengths if n > seq_len]):
        raise _fail(study.path, f"study.niah_lengths {long} exceed training.seq_len = {seq_len} in {study.config}")


def _check_reported(study: Study) -> None:
    """`reported` must name runs of this study that end on a score (dense, frontier or stage 2), each once."""
    reported = study.reported
    if not isinstance(reported, list) or not all(isinstance(n, str) for n in reported):
        raise _fail(study.path, f"study.reported = {reported!r} must be a list of run names")
    if len(set(reported)) != len(reported):
        raise _fail(study.path, f"study.reported = {reported!r} repeats a name")
    kinds = {run.name: run.kind for run in plan_runs(dataclasses.replace(study, reported=[]))}
    if wrong := [n for n in reported if kinds.get(n, "stage1") in ("stage0", "stage1")]:
        finals = sorted(n for n, kind in kinds.items() if kind not in ("stage0", "stage1"))
        raise _fail(study.path, f"study.reported names {wrong}, which are not dense, frontier or stage-2 runs of "
                                f"this study (those are {finals})")


def _layers_suffix(layers: tuple[int, ...]) -> str:
    return "_dl" + ("-".join(map(str, layers)) if layers else "none")


def stage1_of(study: Study, selection: str, topk: int, dense_layers: list[int], seed: int) -> Stage1:
    """The stage-1 run of these settings, named by what differs from the config."""
    name = f"{selection}_s{seed}"
    if topk != _lighthouse_setting(study.base, "topk"):
        name += f"_k{topk}"
    if list(dense_layers) != list(get_key(study.base, "lighthouse.dense_layers", [])):
        name += _layers_suffix(tuple(dense_layers))
    return Stage1(selection, topk, tuple(dense_layers), seed, name)


def plan_runs(study: Study) -> list[Run]:
    """Every run of the study in queue order: block by block, seed by seed, each seed's stage-1 runs and its dense
    run first, then its stage-2 runs; a run that an earlier block already holds is not repeated, and a `reported`
    run is left out (a stage-1 run only when none of its stage-2 runs is left to train)."""
    stage2: dict[str, Run] = {}
    last_switch: dict[Stage1, int] = {}
    order: list[tuple[str, Any]] = []
    for axes in study.grid:
        for seed in axes["seeds"]:
            if study.stage0_seq_len and ("stage0", seed) not in order:
                order.append(("stage0", seed))
            for selection, topk, layers in itertools.product(axes["selection"], axes["topk"], axes["dense_layers"]):
                stage1 = stage1_of(study, selection, topk, layers, seed)
                if stage1 not in last_switch:
                    order.append(("stage1", stage1))
                last_switch[stage1] = max(last_switch.get(stage1, 0), max(axes["switch"]))
            if study.dense and ("dense", seed) not in order:
                order.append(("dense", seed))
            if study.frontier and ("frontier", seed) not in order:
                order.append(("frontier", seed))
            for selection, topk, layers, switch, rewarm in itertools.product(
                    axes["selection"], axes["topk"], axes["dense_layers"], axes["switch"], axes["rewarm_steps"]):
                stage1 = stage1_of(study, selection, topk, layers, seed)
                name = f"{stage1.name}_switch{switch}" + (f"_rewarm{rewarm}" if rewarm else "")
                if name not in stage2:
                    stage2[name] = Run(name, "stage2", seed, stage1, switch, rewarm, study.steps, (stage1.name,))
                    order.append(("stage2", name))
    reported = set(study.reported)
    needed = {run.stage1.name for name, run in stage2.items() if name not in reported}
    runs = []
    for kind, item in order:
        if kind == "stage1" and item.name not in needed:
            continue
        if kind == "stage0":
            runs.append(Run(stage0_name(item), "stage0", item, steps=study.stage0_steps))
        elif kind == "stage1":
            runs.append(Run(item.name, "stage1", item.seed, item, steps=last_switch[item]))
        elif kind == "dense":
            if f"dense_s{item}" not in reported:
                runs.append(Run(f"dense_s{item}", "dense", item, steps=study.steps))
        elif kind == "frontier":
            runs += [Run(name, "frontier", item, steps=n) for n in sorted(study.frontier, reverse=True)
                     if (name := frontier_name(item, n)) not in reported]
        elif item not in reported:
            runs.append(stage2[item])
    if study.stage0_seq_len:  # every run that starts from initial weights starts from stage 0's instead
        runs = [dataclasses.replace(run, after=(stage0_name(run.seed),)) if run.kind in STARTS_FRESH else run
                for run in runs]
        started = {run.seed for run in runs if run.kind in STARTS_FRESH}
        runs = [run for run in runs if run.kind != "stage0" or run.seed in started]
    return runs


STARTS_FRESH = ("stage1", "dense", "frontier")  # the runs that do not resume another run of the study


def stage0_name(seed: int) -> str:
    return f"stage0_s{seed}"


def frontier_name(seed: int, steps: int) -> str:
    return f"dense_s{seed}_steps{steps}"


def long_first(runs: list[Run]) -> list[Run]:
    """`runs` reordered to pack a fixed amount of machine time: stage 0 (which the others start from), dense and
    frontier runs, then every stage 1 (so the stage-2 runs can start), then stage 2 by its dense steps, most first;
    ties keep the study's order."""
    def key(run: Run) -> tuple[int, int]:
        return {"stage0": (-1, 0), "dense": (0, 0), "frontier": (0, 0), "stage1": (1, 0)}.get(
            run.kind, (2, run.switch - run.steps))

    return sorted(runs, key=key)


def arm_first(runs: list[Run]) -> list[Run]:
    """`runs` with each stage-2 run moved up to follow its stage 1 at once, the rest in their places: a queue that runs
    one task at a time (one GPU) then finishes every arm before it starts the next, so a lease stopped by time
    leaves whole arms rather than stage-1 runs waiting for their stage 2."""
    followers: dict[str, list[Run]] = {}
    for run in runs:
        if run.kind == "stage2":
            followers.setdefault(run.stage1.name, []).append(run)
    ordered, moved = [], set()
    for run in runs:
        if run.kind == "stage2" and run.stage1.name in moved:
            continue
        ordered.append(run)
        if run.kind == "stage1":
            ordered += followers.get(run.name, [])
            moved.add(run.name)
    return ordered


def train_command(study: Study, run: Run, python: str = "python3") -> str:
    """The shell command (from the repository root) that trains `run`; rerun, it resumes its latest checkpoint. A
    SIGTERM (a stopped queue, a job's time limit) saves the step it is on, so the run resumes there."""
    own = run.kind in ("frontier", "stage0")  # every other run shares the study's schedule
    schedule = run.steps if own else study.steps
    argv = [python, "train.py", "--job.config_file", study.config,
            "--training.dataset_path", str(study.corpus / "train"),
            "--validation.dataset_path", str(study.corpus / "heldout"),
            "--lr_scheduler.warmup_steps", str(round(study.warmup_steps * schedule / study.steps)),
            "--lr_scheduler.total_steps", str(schedule),
            "--lighthouse.no-log-stats", "--debug.seed", str(run.seed), "--job.dump_folder", str(study.run / run.name),
            "--training.steps", str(run.steps), "--resilience.save_on_sigterm", "on"]
    if run.kind == "frontier":
        argv += ["--validation.freq", str(run.steps), "--checkpoint.interval", str(run.steps)]
    if run.kind == "stage0":
        argv += ["--training.seq_len", str(study.stage0_seq_len), "--validation.seq_len", str(study.stage0_seq_len)]
        if study.stage0_deterministic:
            argv.append("--debug.deterministic")
    elif study.stage0_seq_len and run.kind in STARTS_FRESH:
        argv += ["--checkpoint.initial_load_path",
                 str(study.run / stage0_name(run.seed) / "checkpoint" / f"step-{study.stage0_steps}"),
                 "--checkpoint.initial_load_model_only"]
    if run.kind == "stage1":
        stage1 = run.stage1
        argv += ["--lighthouse.selection", stage1.selection, "--lighthouse.topk", str(stage1.topk),
                 "--lighthouse.dense_layers", *map(str, stage1.dense_layers)]
    else:  # no run resumes its last step: weights alone are all that reads it, a third the size, to move
        argv += ["--lighthouse.no-enable", "--checkpoint.last_save_model_only"]
    if run.kind == "stage2":
        argv += ["--checkpoint.initial_load_path",
                 str(study.run / run.stage1.name / "checkpoint" / f"step-{run.switch}"),
                 "--checkpoint.no-initial-load-model-only"]
        if run.rewarm_steps:
            argv += ["--lr_scheduler.rewarm_at_step", str(run.switch), "--lr_scheduler.rewarm_steps",
                     str(run.rewarm_steps)]
    return shlex.join(argv)


FINAL_KINDS = ("dense", "stage2")  # the runs that end at the study's last step on its schedule


def scored_models(study: Study, runs: list[Run]) -> dict[int, dict[str, int]]:
    """Each seed's models that the per-token pass scores, in queue order, with the step of the checkpoint it
    reads: the final models at the study's last step and, in an extension study, the frontier runs at their own
    last step (their only save), so that the report places each arm on a frontier per position class."""
    kinds = FINAL_KINDS + ("frontier",) if study.stage0_seq_len else FINAL_KINDS
    scored: dict[int, dict[str, int]] = {}
    for run in runs:
        if run.kind in kinds:
            scored.setdefault(run.seed, {})[run.name] = run.steps
    return scored
