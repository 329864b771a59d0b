"""Sweeps over Lighthouse settings: one validated TOML per grid point, the SLURM commands, a summary table.

  python scripts/sweep.py create configs/<base>.toml --levels 3 4 5 --pool 2 4 8 --topk 1536 2048 4096 \\
      --scorer norm dilated [--set training.seq_len 65536 98304] [--stage2-steps 8000] \\
      [--sbatch "--nodes=2 --partition=gpu"] [--submit | --local [--launcher "torchrun --nproc_per_node=8"]]
  python scripts/sweep.py summary sweeps/<name> [other sweeps or run dump folders] [--format md|csv|json]

`create` writes `sweeps/<name>/<run>.toml` for every point that passes `LighthouseConfig.validate(seq_len)`,
torchtitan's own config parsing and train.py's start-up checks of the settings (invalid points are reported
with the reason and not written; with no valid point nothing is written, sweep.json included), gives each run
its own `[job] dump_folder` (so its own checkpoint and log folders), records the sweep in
`sweeps/<name>/sweep.json`, and prints (or, with --submit, runs) one `slurm/submit.sh` line per point.
With --local it trains the points here instead, one stage after another (`<launcher> train.py
--job.config_file <stage>.toml`), records each stage's exit code and times in sweep.json as it ends, and
stops at the first failure, exiting with its code.
With --stage2-steps, each point is the two-stage recipe: `<run>.toml` trains with Lighthouse and
`<run>.stage2.toml` resumes its final checkpoint (model, optimizer, LR schedule, data, step) with dense
attention in a folder of its own, chained with --dependency=afterok (locally: it runs after stage 1 succeeded).
`summary` prints the table and exits 0 when at least one run has logged a step, 1 when none has, and 2 when
a path does not exist, a sweep has no written point or its sweep.json is not a sweep's record.
Run both subcommands from the repository root: the paths in the TOMLs and commands start there.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eval.options import output_folder, read_json
from recipe.experiments.sweep import LIGHTHOUSE_AXES, MANIFEST, create_sweep
from recipe.experiments.sweep_summary import FORMATS, is_sweep_record, print_summary
from recipe.logs.run_logs import LOSS_TAG, TPS_TAG
from recipe.toml_config import tomllib


def base_config(text: str) -> Path:
    """argparse type of create's base config: no folder (reading one ended in IsADirectoryError's traceback); one
    that does not exist or cannot be read is named when the sweep reads it."""
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; name the TOML file every point starts from")
    return Path(text)


def sweep_name(text: str) -> str:
    """argparse type of --name: it prefixes every run's file name, so a '/' (or a name of '.' or '..') would put
    the points' TOMLs in another folder, which the check of each point failed on with a scratch path's
    FileNotFoundError."""
    if "/" in text or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r} must be a file name, without '/' (it prefixes every run's TOML)")
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The subcommand and its options; exits with code 2 on options that do not go together."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("create", help="write one validated TOML per grid point and the submit commands")
    make.add_argument("base", type=base_config, help="the TOML every point starts from")
    for name, kind in LIGHTHOUSE_AXES.items():
        make.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, nargs="+",
                          help=f"values of [lighthouse] {name}")
    make.add_argument("--set", nargs="+", action="append", metavar=("SECTION.KEY", "VALUE"),
                      help="sweep any key: --set training.seq_len 65536 98304 (TOML literals; repeatable)")
    make.add_argument("--name", type=sweep_name,
                      help="sweep name, the prefix of every run name (default: the base file's stem)")
    make.add_argument("--out", type=output_folder,
                      help="folder of the TOMLs and sweep.json (default: sweeps/<name>)")
    make.add_argument("--dump-root",
                      help="runs go to <dump-root>/<point>[.stage2] (default: <base dump_folder>/<name>)")
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
                      help="skip parsing each TOML with torchtitan's ConfigManager and train.py's checks of its "
                           "settings (LighthouseConfig checks remain)")
    report = commands.add_parser("summary", help="one table of final loss and tok/s over sweeps or run folders")
    report.add_argument("paths", type=Path, nargs="+", help="sweep folders (with sweep.json) or run dump folders")
    report.add_argument("--format", choices=FORMATS, default="md")
    report.add_argument("--loss-tag", default=LOSS_TAG)
    report.add_argument("--tps-tag", default=TPS_TAG)
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
    """Run the subcommand; exit code 2 with one line on stderr for a bad grid, path or config."""
    args = parse_args(argv)
    try:
        if args.command == "summary":
            for manifest in (path / MANIFEST for path in args.paths if (path / MANIFEST).is_file()):
                read_json(manifest, "the sweep record", "an object with points, as sweep.py create writes",
                          is_sweep_record)
            return print_summary(args.paths, args.format, args.loss_tag, args.tps_tag)
        return create_sweep(args.base, {name: getattr(args, name) for name in LIGHTHOUSE_AXES}, args.set or [],
                            name=args.name, out=args.out, dump_root=args.dump_root, stage2_steps=args.stage2_steps,
                            sbatch=args.sbatch, submit=args.submit, local=args.local, launcher=args.launcher,
                            force=args.force, check_with_torchtitan=not args.no_torchtitan_check)
    except (ValueError, RuntimeError, OSError, tomllib.TOMLDecodeError) as err:
        print(f"sweep.py {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
