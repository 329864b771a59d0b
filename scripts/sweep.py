"""Sweeps over Lighthouse settings: one validated TOML per grid point, the SLURM commands, a summary table.

  python scripts/sweep.py create configs/<base>.toml --levels 3 4 5 --pool 2 4 8 --topk 1536 2048 4096 \\
      --scorer norm dilated [--set training.seq_len 65536 98304] [--stage2-steps 6000] \\
      [--sbatch "--nodes=2 --partition=gpu"] [--submit | --local [--launcher "torchrun --nproc_per_node=8"]]
  python scripts/sweep.py summary sweeps/<name> [other sweeps or run dump folders] [--format md|csv|json]

`create` writes `sweeps/<name>/<run>.toml` for every point that passes `LighthouseConfig.validate(seq_len)`
and torchtitan's own config parsing (invalid points are reported with the reason and not written), gives
each run its own `[job] dump_folder` (so its own checkpoint and log folders), records the sweep in
`sweeps/<name>/sweep.json`, and prints (or, with --submit, runs) one `slurm/submit.sh` line per point.
With --local it trains the points here instead, one stage after another (`<launcher> train.py
--job.config_file <stage>.toml`), records each stage's exit code and times in sweep.json as it ends, and
stops at the first failure, exiting with its code.
With --stage2-steps, each point is the two-stage recipe: `<run>.toml` trains with Lighthouse and
`<run>.stage2.toml` resumes its final checkpoint (model, optimizer, LR schedule, data, step) with dense
attention in a folder of its own, chained with --dependency=afterok (locally: it runs after stage 1 succeeded).
`summary` prints the table and exits 0 when at least one run has logged a step, 1 when none has, and 2 when
a path does not exist or a sweep has no written point.
Run both subcommands from the repository root: the paths in the TOMLs and commands start there.
"""
from __future__ import annotations

import argparse
import copy
import csv
import io
import itertools
import json
import logging
import math
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import run_logs

REPO = Path(__file__).resolve().parents[1]
MANIFEST = "sweep.json"
# The Lighthouse knobs with their own flags, and the short names they take in run names.
LIGHTHOUSE_AXES = {"levels": int, "pool": int, "topk": int, "tile_budget": int, "scorer": str, "dilation": int,
                   "backend": str}
SHORT_NAMES = {"levels": "L", "pool": "p", "topk": "k", "tile_budget": "m", "dilation": "d"}


# ---------------------------------------------------------------------------------------------- TOML I/O
def load_toml(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _toml_string(text: str) -> str:
    # JSON's escapes are valid TOML basic-string escapes; TOML also forbids a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} value {value!r} as TOML")


def dump_toml(config: dict[str, Any], header: str = "") -> str:
    """TOML text for `config`: top-level keys, then one `[section]` (or `[section.sub]`) per table."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]

    def write_table(name: str, table: dict[str, Any]) -> None:
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
        tables = [(k, v) for k, v in table.items() if isinstance(v, dict)]
        if name and (scalars or not tables):
            lines.extend(["", f"[{name}]"] if lines else [f"[{name}]"])
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars)
        for key, sub in tables:
            write_table(f"{name}.{_toml_key(key)}" if name else _toml_key(key), sub)

    write_table("", config)
    return "\n".join(lines) + "\n"


def get_key(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_key(config: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, key = dotted.split(".")
    node = config
    for part in sections:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {dotted}: {part} is a value, not a table")
    node[key] = value


# -------------------------------------------------------------------------------------------------- grid
def parse_value(text: str) -> Any:
    """A TOML literal (`4`, `2e-3`, `true`, `[0, 1]`, `"x"`), or the text itself as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def grid_axes(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, list[Any]]:
    """Dotted key -> values, in flag order; raises ValueError naming a repeated key or a value whose type
    differs from the base config's."""
    axes: dict[str, list[Any]] = {}
    for name in LIGHTHOUSE_AXES:
        values = getattr(args, name)
        if values:
            axes[f"lighthouse.{name}"] = values
    for key, *texts in args.set or []:
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
        text = "-".join(map(str, value)) if isinstance(value, list) else _toml_value(value).strip('"')
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
        raise ValueError(f"[lr_scheduler] total_steps={scheduled} differs from training.steps={steps} + "
                         f"--stage2-steps={stage2_steps} = {total}")
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
    """Parse `path` the way train.py will (JobConfig plus its custom_config_module); ValueError if rejected."""
    from torchtitan.config import ConfigManager

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # torchtitan warns about unrelated paths (hf_assets_path) while parsing
    try:
        ConfigManager().parse_args(["--job.config_file", str(path)])
    except SystemExit as err:
        raise ValueError(f"torchtitan's parser rejected it (exit {err.code})") from None
    except Exception as err:  # the custom module may raise anything while importing or building
        raise ValueError(f"torchtitan's parser rejected it: {str(err).splitlines()[0]}") from err
    finally:
        root.setLevel(level)


@dataclass
class SweepPoint:
    label: str
    run: str
    values: dict[str, Any]
    configs: list[str] = field(default_factory=list)
    dump_folders: list[str] = field(default_factory=list)
    stage_steps: list[int] = field(default_factory=list)
    seq_len: int | None = None
    gathered_len: int | None = None
    error: str | None = None


def make_point(base: dict[str, Any], values: dict[str, Any], args: argparse.Namespace, out: Path,
               dump_root: str, check: bool) -> SweepPoint:
    """Build, validate and write one point; a point that fails any check is reported and not written."""
    label = point_label(values)
    point = SweepPoint(label, f"{args.name}-{label}", values)
    written: list[Path] = []
    try:
        stages = build_stages(base, values, point.run, f"{dump_root}/{label}", args.stage2_steps)
        point.dump_folders = [get_key(stage, "job.dump_folder") for stage in stages]
        point.seq_len = get_key(stages[0], "training.seq_len")
        point.gathered_len = gathered_len(stages[0])
        point.stage_steps = [get_key(stage, "training.steps", 0) for stage in stages]
        for index, stage in enumerate(stages):
            name = point.run if index == 0 else f"{point.run}.stage{index + 1}"
            header = (f"Generated by scripts/sweep.py from {args.base} (sweep {args.name}, point {label}, "
                      f"stage {index + 1} of {len(stages)}).\nEdit the base config and re-run the sweep instead.")
            path = out / f"{name}.toml"
            path.write_text(dump_toml(stage, header))
            written.append(path)
            if check:
                torchtitan_check(path)
    except ValueError as err:
        point.error = str(err)
        for path in written:
            path.unlink()
        return point
    point.configs = [str(path) for path in written]
    return point


# ------------------------------------------------------------------------------------------------ create
def submit_command(point: SweepPoint, sbatch: str) -> list[str]:
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


def create(args: argparse.Namespace) -> int:
    base = load_toml(args.base)
    args.name = args.name or args.base.stem
    axes = grid_axes(args, base)
    out = args.out or Path("sweeps") / args.name
    if (out / MANIFEST).exists() and not args.force:
        raise ValueError(f"{out / MANIFEST} exists: pass --force to write the sweep again, or pick another --name")
    out.mkdir(parents=True, exist_ok=True)
    dump_root = args.dump_root or f"{get_key(base, 'job.dump_folder', './outputs').rstrip('/')}/{args.name}"
    check = not args.no_torchtitan_check
    if check:
        try:
            import torchtitan.config  # noqa: F401
        except ImportError:
            print("note: torchtitan is not importable; points are checked by LighthouseConfig only", file=sys.stderr)
            check = False
    # The recipe's modules (e.g. [job] custom_config_module = "recipe.job_config") live at the repository root.
    sys.path.insert(0, str(REPO))
    points = [make_point(base, dict(zip(axes, combo)), args, out, dump_root, check)
              for combo in itertools.product(*axes.values())]
    runs = [point.run for point in points]
    if len(set(runs)) != len(runs):
        raise ValueError(f"two grid points got the same run name: {sorted(r for r in runs if runs.count(r) > 1)}")
    valid = [point for point in points if point.error is None]
    print(f"sweep {args.name}: {len(points)} points, {len(valid)} written to {out}, "
          f"{len(points) - len(valid)} invalid")
    for point in points:
        if point.error is None:
            print(f"  ok       {point.label}  S={point.gathered_len} of N={point.seq_len}")
        else:
            print(f"  invalid  {point.label}  {point.error}")
    commands = [submit_command(point, args.sbatch) for point in valid]
    jobs: dict[str, str] = {}
    local_runs: dict[str, list[dict[str, Any]]] = {}

    def write_manifest() -> None:
        manifest = {
            "name": args.name,
            "base": str(args.base),
            "axes": axes,
            "stage2_steps": args.stage2_steps,
            "points": [{**vars(point), "jobs": jobs.get(point.run), "local_runs": local_runs.get(point.run)}
                       for point in points],
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    if args.local:
        write_manifest()
        launcher = shlex.split(args.launcher) if args.launcher else [sys.executable]
        code = run_local(valid, launcher, local_runs, write_manifest)
        if code:
            return code
    elif args.submit:
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
    return 0 if valid else 1


# ----------------------------------------------------------------------------------------------- summary
def summarize_run(name: str, dump_folders: list[Path], final_step: int | None, loss_tag: str,
                  tps_tag: str) -> dict[str, Any]:
    """Final loss, per-GPU throughput of each stage (one dump folder per stage), MFU of the first stage and
    peak memory of one run, from whatever logs its folders hold."""
    stages = [run_logs.read_logs(folder) if folder.is_dir() else [] for folder in dump_folders]
    every = [log for logs in stages for log in logs]
    final = run_logs.latest(every, loss_tag)
    row: dict[str, Any] = {
        "run": name,
        "step": final.step if final else None,
        "final_loss": final.value if final else None,
        "tok_s_gpu": run_logs.steady_median(stages[0], tps_tag),
    }
    if len(stages) > 1:
        row["dense_tok_s_gpu"] = run_logs.steady_median(stages[1], tps_tag)
    row["mfu_pct"] = run_logs.steady_median(stages[0], run_logs.MFU_TAG)
    row["peak_gib"] = run_logs.peak(every, run_logs.MEMORY_TAG)
    if final is None:
        row["status"] = "no logs"
    elif final_step is not None and final.step < final_step:
        row["status"] = f"at step {final.step}/{final_step}"
    else:
        row["status"] = "done"
    return row


def summary_rows(path: Path, loss_tag: str, tps_tag: str) -> list[dict[str, Any]]:
    """Rows for a sweep folder (one per written point, with its swept values and S), or for one run's dump
    folder."""
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        return [summarize_run(path.name, [path], None, loss_tag, tps_tag)]
    manifest = json.loads(manifest_path.read_text())
    rows = []
    for point in manifest["points"]:
        if point["error"] is not None:
            continue
        folders = [Path(folder) for folder in point["dump_folders"]]
        row = summarize_run(point["run"], folders, point["stage_steps"][-1], loss_tag, tps_tag)
        swept = {key.rpartition(".")[2]: value for key, value in point["values"].items()}
        rows.append({"run": row.pop("run"), **swept, "S": point["gathered_len"], **row})
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4f}"
    return str(value)


def format_table(rows: list[dict[str, Any]], fmt: str) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue().rstrip("\n")
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
    lines = [columns, ["-" * width for width in widths], *cells]
    return "\n".join("| " + " | ".join(text.ljust(width) for text, width in zip(line, widths)) + " |"
                     for line in lines)


def summary(args: argparse.Namespace) -> int:
    """Print the table; 1 when no run has logged a step (the table still says which runs it looked at)."""
    missing = [str(path) for path in args.paths if not path.exists()]
    if missing:
        raise ValueError(f"{', '.join(missing)} does not exist")
    rows = [row for path in args.paths for row in summary_rows(path, args.loss_tag, args.tps_tag)]
    if not rows:
        raise ValueError(f"no runs found in {', '.join(map(str, args.paths))}")
    print(format_table(rows, args.format))
    if all(row["step"] is None for row in rows):
        print(f"sweep.py summary: no run in {', '.join(map(str, args.paths))} has logged a step", file=sys.stderr)
        return 1
    return 0


# -------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("create", help="write one validated TOML per grid point and the submit commands")
    make.add_argument("base", type=Path, help="the TOML every point starts from")
    for name, kind in LIGHTHOUSE_AXES.items():
        make.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, nargs="+",
                          help=f"values of [lighthouse] {name}")
    make.add_argument("--set", nargs="+", action="append", metavar=("SECTION.KEY", "VALUE"),
                      help="sweep any key: --set training.seq_len 65536 98304 (TOML literals; repeatable)")
    make.add_argument("--name", help="sweep name, the prefix of every run name (default: the base file's stem)")
    make.add_argument("--out", type=Path, help="folder of the TOMLs and sweep.json (default: sweeps/<name>)")
    make.add_argument("--dump-root", help="runs go to <dump-root>/<point>[.stage2] (default: <base dump_folder>/<name>)")
    make.add_argument("--stage2-steps", type=int, help="add a dense stage 2 of this many steps to every point")
    make.add_argument("--sbatch", default="", help='sbatch options for every job, e.g. "--nodes=2 --time=12:00:00"')
    run = make.add_mutually_exclusive_group()
    run.add_argument("--submit", action="store_true", help="submit the jobs instead of printing the commands")
    run.add_argument("--local", action="store_true",
                     help="train the points here, one stage after another, stopping at the first failure")
    make.add_argument("--launcher", help='with --local: what starts train.py, e.g. "torchrun --nproc_per_node=8" '
                      "(default: this Python)")
    make.add_argument("--force", action="store_true", help="write over an existing sweep of the same name")
    make.add_argument("--no-torchtitan-check", action="store_true",
                      help="skip parsing each TOML with torchtitan's ConfigManager (LighthouseConfig checks remain)")
    report = commands.add_parser("summary", help="one table of final loss and tok/s over sweeps or run folders")
    report.add_argument("paths", type=Path, nargs="+", help="sweep folders (with sweep.json) or run dump folders")
    report.add_argument("--format", choices=("md", "csv", "json"), default="md")
    report.add_argument("--loss-tag", default=run_logs.LOSS_TAG)
    report.add_argument("--tps-tag", default=run_logs.TPS_TAG)
    args = parser.parse_args(argv)
    for key_values in getattr(args, "set", None) or []:
        if len(key_values) < 2:
            parser.error(f"--set {key_values[0]} needs at least one value")
    if getattr(args, "stage2_steps", None) is not None and args.stage2_steps < 1:
        parser.error(f"--stage2-steps={args.stage2_steps} must be >= 1")
    if getattr(args, "launcher", None) is not None and not args.local:
        parser.error(f"--launcher {args.launcher!r} is used with --local only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return create(args) if args.command == "create" else summary(args)
    except (ValueError, RuntimeError, FileNotFoundError, tomllib.TOMLDecodeError) as err:
        print(f"sweep.py {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
