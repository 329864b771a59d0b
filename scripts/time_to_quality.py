"""Report of scripts/time_to_quality.sh: held-out loss against training seconds, speedups, one plot.

    python scripts/time_to_quality.py --run outputs/time_to_quality --out outputs/time_to_quality/report

Reads every arm under --run (eval.studies.time_to_quality) and writes `<out>.json` (one object per arm: name,
selection, switch_step, stage 1's dense_layers and topk, total_steps, seq_len, seed, device, train_seconds,
final_heldout_loss, curve, and for Lighthouse arms the seconds dense needs to reach that loss, the time-to-quality
speedup, the stage-1 per-step speedups and the exchange rates, against the dense arm of the same seed), `<out>.png`
(against seconds) and `<out>_steps.png` (against steps, stage 1's own Lighthouse loss dashed); prints a markdown
table.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from eval.options import output_file, positive_int
from eval.records import write_record
from eval.studies.time_to_quality import (ARMS_COMMAND, load_arms, markdown_table, plot_curves, plot_steps,
                                          report_records)
from recipe.errors import ConfigError, exit_on_config_error


def main(argv: list[str] | None = None) -> list[dict]:
    """Write the report of the arms under --run and print its table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="the RUN folder of scripts/time_to_quality.sh")
    p.add_argument("--out", type=output_file, required=True, help="output path prefix (.json, .png)")
    p.add_argument("--seq-len", type=positive_int, default=65536, help="tokens per window of the runs")
    p.add_argument("--device", help="a label for the card the arms ran on (default: the card each arm's run records "
                                    "name)")
    p.add_argument("--commit", default="unknown", help="the commit of the tree the arms ran")
    p.add_argument("--command", default=ARMS_COMMAND, help="the command that ran the arms, for the records")
    args = p.parse_args(argv)
    if not args.run.is_dir():
        raise ConfigError(f"--run={str(args.run)!r} is not a folder (the RUN folder of scripts/time_to_quality.sh)")
    try:
        arms = load_arms(args.run)
    except ValueError as err:  # an arm whose steps or validations are not all logged
        raise ConfigError(f"--run={str(args.run)!r}: {err}") from err
    if not arms:
        raise ConfigError(f"--run={str(args.run)!r} holds no complete arm")
    records = report_records(arms, args.seq_len, args.device, args.commit, args.command)
    write_record(args.out, records, indent=1)
    where = f"seq {args.seq_len:,}, {args.device or ', '.join(sorted({r['device'] for r in records}))}"
    plot_curves(arms, str(args.out.with_suffix(".png")), f"held-out loss vs training seconds, {where}")
    plot_steps(arms, str(args.out.with_name(args.out.name + "_steps.png")), f"held-out loss vs steps, {where}")
    print(markdown_table(records))
    return records


if __name__ == "__main__":
    with exit_on_config_error():
        main()
