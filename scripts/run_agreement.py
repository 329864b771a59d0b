"""Compare two trainings of one command, step by step: whether they agree bit for bit, where they part and how far
apart they end, per logged tag (training loss, gradient norm, held-out loss; eval/studies/run_agreement.py).

    python scripts/run_agreement.py outputs/run_a outputs/run_b --device "NVIDIA H200" --commit 60dba4d --json cmp.json
"""
from __future__ import annotations

import argparse
from pathlib import Path

from eval.options import file_to_write
from eval.records import command_line, shown_path, write_json
from eval.studies.run_agreement import compare_runs
from recipe.logs.layout import METRICS_FILE


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="a run's dump folder (with metrics.jsonl)")
    parser.add_argument("second", type=Path, help="the other run's dump folder")
    parser.add_argument("--device", default="unknown", help="the card the runs ran on, for the record")
    parser.add_argument("--commit", default="unknown", help="the commit of the tree that ran them, for the record")
    parser.add_argument("--json", type=file_to_write, help="write the record here")
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        if not (folder / METRICS_FILE).is_file():
            parser.error(f"{folder} has no {METRICS_FILE}: name a run's dump folder")
    try:
        tags = compare_runs(args.first, args.second)
    except ValueError as error:  # it names the run at fault: one metrics file, or both folders
        parser.error(str(error))
    if not tags:
        parser.error(f"{args.first} and {args.second} share no logged tag")
    for tag, a in tags.items():
        parts = "bit for bit" if a["bitwise"] else f"differ from step {a['first_difference']}"
        print(f"{tag}: {a['steps']} steps, {parts}; max |diff| {a['max_abs_difference']:.3g}; "
              f"step {a['final_step']}: {a['final'][0]:.6g} and {a['final'][1]:.6g} ({a['final_difference']:+.3g})")
    record = {"runs": [shown_path(args.first), shown_path(args.second)], "device": args.device, "commit": args.commit,
              "command": command_line(), "tags": tags}
    if args.json:
        write_json(args.json, record)
    return record


if __name__ == "__main__":
    main()
