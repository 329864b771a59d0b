"""Summarise a scripts/replicate.sh run: results.json, the loss-curve PNG and markdown tables.

    python scripts/replicate_report.py --run outputs/replicate --steps 800             # into the run folder
    python scripts/replicate_report.py --run outputs/replicate --steps 800 --publish   # and into docs/records/

The report goes to `--out` (default: the run folder); only `--publish` writes the tracked
docs/records/results.json and docs/records/replicate_loss.png. What it measures (wall clock and training-loop time, the
switch analysis against the dense arm) is described in `eval.studies.replicate`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eval.options import output_folder, positive_int
from eval.studies.replicate import DOCS, tokens_per_step, write_report
from recipe.errors import ConfigError, exit_on_config_error


def main(argv: list[str] | None = None) -> dict:
    """Write the report of --run (other arguments are job arguments of the arms) and print its tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--run", type=Path, required=True, help="the RUN folder of scripts/replicate.sh")
    p.add_argument("--steps", type=positive_int, required=True)
    p.add_argument("--out", type=output_folder, help="folder for results.json, replicate_loss.png and report.md "
                   "(default: the run folder)")
    p.add_argument("--publish", action="store_true",
                   help=f"also write results.json and replicate_loss.png into {DOCS} (tracked files)")
    p.add_argument("--config", default="configs/replicate/small.toml")
    args, extra = p.parse_known_args(argv)
    if not args.run.is_dir():
        raise ConfigError(f"--run={str(args.run)!r} is not a folder (the RUN folder of scripts/replicate.sh)")
    out = args.out or args.run
    tokens = tokens_per_step(["--job.config_file", args.config, *extra])
    try:
        results, table = write_report(args.run, args.steps, tokens, out, DOCS if args.publish else None)
    except FileNotFoundError as err:  # an arm of the run that did not finish (or never started)
        raise ConfigError(f"--run={str(args.run)!r} has no {err.filename}: is every arm of the run finished?") from err
    print(table)
    print(f"report: {out}" + (f", published to {DOCS}" if args.publish else ""))
    return results


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
