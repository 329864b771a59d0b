"""Sweeps over Lighthouse settings: one validated TOML per grid point, then SLURM jobs or local runs.

`create_sweep` writes `<out>/<run>.toml` for every point that passes `LighthouseConfig.validate(seq_len)`,
torchtitan's own config parsing and train.py's checks of the settings (invalid points are reported with the
reason and not written; with no valid point nothing is written), gives each run its own `[job] dump_folder` (so
its own checkpoint and log folders), records the sweep in `<out>/sweep.json`, and prints (or submits) one
`slurm/submit.sh` line per point, or trains the points on this machine.
With `stage2_steps`, each point is the two-stage recipe: `<run>.toml` trains with Lighthouse and
`<run>.stage2.toml` resumes its final checkpoint (model, optimizer, LR schedule, data, step) with dense
attention in a folder of its own. Paths in the TOMLs and commands start at the repository root.
"""
from __future__ import annotations

import copy
import itertools
import json
import logging
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from recipe.logs.run_record import REPO
from recipe.progress import progress_bar
from recipe.toml_config import dump_toml, get_key, parse_value, read_config_file, set_key, toml_value

MANIFEST = "sweep.json"
# The Lighthouse knobs with their own flags, and the short names they take in run names.
LIGHTHOUSE_AXES = {"levels": int, "pool": int, "topk": int, "tile_budget": int, "scorer": str, "dilation": int,
                   "backend": str}
SHORT_NAMES = {"levels": "L", "pool": "p", "topk": "k", "tile_budget": "m", "dilation": "d"}


# -------------------------------------------------------------------------------------------------- grid
def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def grid_axes(lighthouse: dict[str, list[Any] | None], sets: list[list[str]],
              base: dict[str, Any]) -> dict[str, list[Any]]:
    """Dotted key -> values: the `[lighthouse]` knobs given (in LIGHTHOUSE_AXES order), then each `sets` entry
    ([key, TOML literal, ...]). Raises ValueError naming a repeated key or value, or a value whose type
    differs from the base config's."""
    axes: dict[str, list[Any]] = {}
    for name in LIGHTHOUSE_AXES:
        values = lighthouse.get(name)
        if values:
            axes[f"lighthouse.{name}"] = values
    for key, *texts in sets:
        if key in axes:
            raise ValueError(f"--set {key} repeats an axis that is already swept")
        if "." not in key:
            raise ValueError(f"--set {key}: name a key as section.key, e.g. training.seq_len")
        axes[key] = [parse_value(text) for text in texts]
    for key, values in axes.items():
        if len(set(map(json.dumps, values))) != len(values):
            raise ValueError(f"{key} lists a value twice: {values}")
        current = get_key(base, key)
        for value in values:
            if current is not None and _kind(current) != _kind(value):
                raise ValueError(f"{key}={value!r} is a {type(value).__name__}, but the base config has "
                                 f"{key}={current!r}")
    if not axes:
        raise ValueError("the grid is empty: give at least one of --levels/--pool/--topk/... or --set")
    return axes


def point_label(point: dict[str, Any]) -> str:
    """A file-name-safe label naming every swept value, e.g. `L3-p4-k2048-norm`."""
    parts = []
    for key, value in point.items():
        section, _, name = key.rpartition(".")
        text = "-".join(map(str, value)) if isinstance(value, list) else toml_value(value).strip('"')
        if section == "lighthouse" and name in ("scorer", "backend"):
            parts.append(text)
        elif section == "lighthouse" and name in SHORT_NAMES:
            parts.append(f"{SHORT_NAMES[name]}{text}")
        else:
            parts.append(f"{name}{text}")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts))


# -------------------------------------------------------------------------------------------- one point
def gathered_len(config: dict[str, Any]) -> int:
    """S for this config's `[lighthouse]` section at `[training] seq_len`; raises ValueError naming the
    values if the pair is invalid (also checked at `[validation] seq_len` when validation is on)."""
    from lighthouse import LighthouseConfig

    section = config.get("lighthouse", {})
    missing = [name for name in ("levels", "pool", "topk") if name not in section]
    if missing:
        raise ValueError(f"[lighthouse] {', '.join(missing)} is set neither in the base config nor in the grid")
    seq_len = get_key(config, "training.seq_len")
    if seq_len is None:
        raise ValueError("[training] seq_len is not set")
    settings = {f.name: section[f.name] for f in fields(LighthouseConfig) if f.name in section}
    lighthouse = LighthouseConfig(**settings)
    seq_lens = {"training.seq_len": seq_len}
    if get_key(config, "validation.enable"):
        seq_lens["validation.seq_len"] = get_key(config, "validation.seq_len", seq_len)
    for name, length in seq_lens.items():
        try:
            lighthouse.validate(length)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name}={length}: {err}") from err
    return lighthouse.gathered_len(seq_len)


def build_stages(base: dict[str, Any], point: dict[str, Any], run: str, dump_folder: str,
                 stage2_steps: int | None) -> list[dict[str, Any]]:
    """The stage configs of one point: Lighthouse on, the point's values, its own dump folder; with
    `stage2_steps`, a second stage with dense attention for that many more steps, in `<dump_folder>.stage2`,
    that starts from stage 1's final full checkpoint (one LR schedule over both stages). Stage 2 keeps its
    own checkpoints apart, so its `keep_latest_k` never purges stage 1's, and a requeued stage 2 resumes
    from its own latest."""
    stage1 = copy.deepcopy(base)
    for key, value in point.items():
        set_key(stage1, key, value)
    set_key(stage1, "lighthouse.enable", True)
    set_key(stage1, "job.dump_folder", dump_folder)
    set_key(stage1, "job.description", run)
    if stage2_steps is None:
        return [stage1]
    switch = get_key(stage1, "lighthouse.switch_to_dense_at_step", 0)
    if switch:
        raise ValueError(f"[lighthouse] switch_to_dense_at_step={switch} and --stage2-steps={stage2_steps} both "
                         "switch to dense attention: use one")
    steps = get_key(stage1, "training.steps")
    if steps is None:
        raise ValueError("[training] steps (the stage-1 length) is not set")
    total = steps + stage2_steps
    scheduled = get_key(stage1, "lr_scheduler.total_steps")
    if scheduled is not None and scheduled != total:
        hint = f"; the base schedule fits --stage2-steps {scheduled - steps}" if scheduled > steps else ""
        raise ValueError(f"[lr_scheduler] total_steps={scheduled} differs from training.steps={steps} + "
                         f"--stage2-steps={stage2_steps} = {total}{hint}")
    set_key(stage1, "lr_scheduler.total_steps", total)
    set_key(stage1, "checkpoint.enable", True)
    stage2 = copy.deepcopy(stage1)
    # torchtitan saves the last step model-only by default, which stage 2 could not resume from.
    set_key(stage1, "checkpoint.last_save_model_only", False)
    set_key(stage2, "lighthouse.enable", False)
    set_key(stage2, "training.steps", total)
    set_key(stage2, "job.dump_folder", f"{dump_folder}.stage2")
    set_key(stage2, "job.description", f"{run} stage 2 (dense)")
    checkpoints = f"{dump_folder}/{get_key(stage1, 'checkpoint.folder', 'checkpoint')}"
    set_key(stage2, "checkpoint.initial_load_path", f"{checkpoints}/step-{steps}")
    set_key(stage2, "checkpoint.initial_load_model_only", False)
    return [stage1, stage2]


def torchtitan_check(path: Path) -> None:
    """Parse `path` the way train.py will (JobConfig plus its custom_config_module), then run train.py's checks of
    the settings alone (`recipe.train.trainer.check_job`: no device, no data); ValueError if either rejects it, so a
    point train.py would refuse at start-up (training.steps = -1, loss.chunk_tokens = 0) is not written."""
    from torchtitan.config import ConfigManager

    from recipe.train.trainer import check_job

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # torchtitan warns about unrelated paths (hf_assets_path) while parsing
    try:
        try:
            job_config = ConfigManager().parse_args(["--job.config_file", str(path)])
        except SystemExit as err:
            raise ValueError(f"torchtitan's parser rejected it (exit {err.code})") from None
        except Exception as err:  # the custom module may raise anything while importing or building
            raise ValueError(f"torchtitan's parser rejected it: {str(err).splitlines()[0]}") from err
        try:
            check_job(job_config)
        except ValueError as err:
            raise ValueError(f"train.py would refuse it: {err}") from None
    finally:
        root.setLevel(level)


@dataclass
class SweepPoint:
    """One grid point: its values, the stage configs written for it (none when invalid) and why not."""

    label: str
    run: str
    values: dict[str, Any]
    configs: list[str] = field(default_factory=list)
    dump_folders: list[str] = field(default_factory=list)
    stage_steps: list[int] = field(default_factory=list)
    seq_len: int | None = None
    gathered_len: int | None = None
    error: str | None = None


def make_point(base: dict[str, Any], values: dict[str, Any], base_path: Path, name: str, out: Path,
               dump_root: str, stage2_steps: int | None, check: Path | None) -> tuple[SweepPoint, dict[Path, str]]:
    """Build and validate one point of sweep `name`: the point, and the text of each stage's TOML under `out`
    (none when the point fails a check, its reason in `point.error`). With `check` (a scratch folder), each
    TOML is also parsed by torchtitan there; nothing is written under `out`."""
    label = point_label(values)
    point = SweepPoint(label, f"{name}-{label}", values)
    files: dict[Path, str] = {}
    try:
        stages = build_stages(base, values, point.run, f"{dump_root}/{label}", stage2_steps)
        point.dump_folders = [get_key(stage, "job.dump_folder") for stage in stages]
        point.seq_len = get_key(stages[0], "training.seq_len")
        point.gathered_len = gathered_len(stages[0])
        point.stage_steps = [get_key(stage, "training.steps", 0) for stage in stages]
        for index, stage in enumerate(stages):
            stage_name = point.run if index == 0 else f"{point.run}.stage{index + 1}"
            header = (f"Generated by scripts/sweep.py from {base_path} (sweep {name}, point {label}, "
                      f"stage {index + 1} of {len(stages)}).\nEdit the base config and re-run the sweep instead.")
            text = dump_toml(stage, header)
            if check is not None:
                scratch = check / f"{stage_name}.toml"
                scratch.write_text(text)
                torchtitan_check(scratch)
            files[out / f"{stage_name}.toml"] = text
    except ValueError as err:
        point.error = str(err)
        return point, {}
    point.configs = [str(path) for path in files]
    return point, files


# ------------------------------------------------------------------------------------------------ create
def submit_command(point: SweepPoint, sbatch: str) -> list[str]:
    """The `slurm/submit.sh` command line that chains the point's stages."""
    return ["slurm/submit.sh", *shlex.split(sbatch), *point.configs]


def run_local(points: list[SweepPoint], launcher: list[str], records: dict[str, list[dict[str, Any]]],
              save: Callable[[], None]) -> int:
    """Train every stage of every point on this machine, one after another, recording each stage's config,
    exit code and start/end time in `records[run]` and calling `save` as it ends. Stops at the first failure
    and returns its exit code (128 + N for a stage killed by signal N); 0 when every stage succeeded."""
    for point in points:
        for config in point.configs:
            command = [*launcher, str(REPO / "train.py"), "--job.config_file", config]
            print(f"# {point.run}: {shlex.join(command)}", flush=True)
            start = time.time()
            code = subprocess.run(command).returncode
            records.setdefault(point.run, []).append(
                {"config": config, "exit_code": code, "start": start, "end": time.time()})
            save()
            if code != 0:
                code = code if code > 0 else 128 - code
                print(f"sweep.py create: {config} failed (exit code {code}); the stages after it were not run",
                      file=sys.stderr)
                return code
    return 0


def create_sweep(base_path: Path, lighthouse: dict[str, list[Any] | None], sets: list[list[str]], *,
                 name: str | None = None, out: Path | None = None, dump_root: str | None = None,
                 stage2_steps: int | None = None, sbatch: str = "", submit: bool = False, local: bool = False,
                 launcher: str | None = None, force: bool = False, check_with_torchtitan: bool = True) -> int:
    """Write the sweep of `base_path` over the grid (see `grid_axes`) into `out` (default `sweeps/<name>`,
    name defaulting to the base file's stem), print a line per point, then print the submit commands, or
    run them (`submit`), or train the points here (`local`, each stage started by `launcher`, default this
    Python). Every point is checked before any file is written. Returns 0 when a point was written (and every
    local stage succeeded), 2 when no point is valid (nothing is written then, `sweep.json` included), or the
    exit code of the local stage that failed. Raises ValueError for a bad grid or an existing sweep without
    `force`, RuntimeError for a failed submission."""
    base = read_config_file(base_path)
    name = name or base_path.stem
    axes = grid_axes(lighthouse, sets, base)
    out = out or Path("sweeps") / name
    if (out / MANIFEST).exists() and not force:
        raise ValueError(f"{out / MANIFEST} exists: pass --force to write the sweep again, or pick another --name")
    dump_root = dump_root or f"{get_key(base, 'job.dump_folder', './outputs').rstrip('/')}/{name}"
    check = check_with_torchtitan
    if check:
        try:
            import torchtitan.config  # noqa: F401
        except ImportError:
            print("note: torchtitan is not importable; points are checked by LighthouseConfig only", file=sys.stderr)
            check = False
    combos = list(itertools.product(*axes.values()))
    progress = progress_bar(len(combos), f"sweep {name}: points checked")
    built = []
    with tempfile.TemporaryDirectory(prefix="sweep-check-") as scratch:
        for combo in combos:
            built.append(make_point(base, dict(zip(axes, combo)), base_path, name, out, dump_root, stage2_steps,
                                    Path(scratch) if check else None))
            progress.update()
    progress.close()
    points = [point for point, _ in built]
    runs = [point.run for point in points]
    if len(set(runs)) != len(runs):
        raise ValueError(f"two grid points got the same run name: {sorted(r for r in runs if runs.count(r) > 1)}")
    valid = [point for point in points if point.error is None]
    print(f"sweep {name}: {len(points)} points, {len(valid)} written to {out}, "
          f"{len(points) - len(valid)} invalid")
    for point in points:
        if point.error is None:
            print(f"  ok       {point.label}  S={point.gathered_len} of N={point.seq_len}")
        else:
            print(f"  invalid  {point.label}  {point.error}")
    if not valid:  # a config mistake: one line names the first point's reason
        more = f" (and {len(points) - 1} more point(s), listed above)" if len(points) > 1 else ""
        print(f"sweep {name}: no valid point, nothing written: {points[0].label}: {points[0].error}{more}",
              file=sys.stderr)
        return 2
    # Every point is checked before anything is written: a sweep with no valid point leaves no files behind.
    out.mkdir(parents=True, exist_ok=True)
    for _, files in built:
        for path, text in files.items():
            path.write_text(text)
    commands = [submit_command(point, sbatch) for point in valid]
    jobs: dict[str, str] = {}
    local_runs: dict[str, list[dict[str, Any]]] = {}

    def write_manifest() -> None:
        manifest = {
            "name": name,
            "base": str(base_path),
            "axes": axes,
            "stage2_steps": stage2_steps,
            "points": [{**vars(point), "jobs": jobs.get(point.run), "local_runs": local_runs.get(point.run)}
                       for point in points],
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    if local:
        write_manifest()
        code = run_local(valid, shlex.split(launcher) if launcher else [sys.executable], local_runs, write_manifest)
        if code:
            return code
    elif submit:
        for point, command in zip(valid, commands):
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{shlex.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
            print(result.stdout, end="")
            jobs[point.run] = " ".join(line.split()[0] for line in result.stdout.splitlines())
    else:
        print("# submit from the repository root:")
        for command in commands:
            print(shlex.join(command))
    write_manifest()
    return 0
