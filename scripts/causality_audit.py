"""Causality audit of a checkpoint: the loss a model owes to tokens after the ones it predicts (eval.metrics.causality).

    python scripts/causality_audit.py --checkpoint outputs/run/checkpoint/step-600 \\
        --data 'outputs/replicate/corpus/heldout/*.jsonl' --out outputs/run/eval/causality \\
        --job.config_file configs/replicate/small.toml --lighthouse.selection causal

For each lookahead b, sampled blocks [c, c + b) of held-out windows are scored with the true continuation and
with every input from c + b on replaced by another window's tokens; the difference is the leak. Writes
`<out>.json` ({"selection", "steps", "results": [...], provenance}) and `<out>.png`. The job arguments choose the
model and the attention; without `--job.config_file` they override the job of the checkpoint's run record
(eval/checkpoint_run.py).

    python scripts/causality_audit.py --combine a.json b.json --out docs/records/causality

merges audit records into `<out>.json`, a list of one object per (record, lookahead) with the keys
selection, steps, lookahead, honest_loss, seen_loss, delta, stderr (plus samples and provenance), and
`<out>.png`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eval.metrics.causality import (causality_audit, checkpoint_steps, combine_records, plot_audit, record_label,
                                    sample_range)
from eval.metrics.cli import evaluation_job_config, evaluation_parser, load_checkpoint
from eval.metrics.heldout import heldout_windows
from eval.options import int_at_least, output_file, positive_int, positive_int_list, read_json, torch_seed
from eval.records import provenance, write_record
from recipe.data.tokenizer import build_tokenizer
from recipe.train.cli import ConfigError, as_config_error, exit_on_config_error

RECORD_KEYS = ("selection", "steps", "results")  # what combine_records and record_label read of a record


def audit(argv: list[str]) -> dict:
    """Audit one checkpoint with the job arguments' attention setting; write and print its record."""
    p = evaluation_parser(__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="glob of held-out files (.txt/.jsonl/.json/.parquet)")
    p.add_argument("--windows", type=lambda text: int_at_least(text, 2), default=16,
                   help="held-out windows to sample from (at least 2: one lends the other its replacement tokens)")
    p.add_argument("--samples", type=positive_int, default=192,
                   help="sampled block starts c (each audited at every lookahead)")
    p.add_argument("--lookaheads", type=positive_int_list, default=[1, 4, 16, 64, 256])
    p.add_argument("--seed", type=torch_seed, default=0, help="seed of the sampled positions")
    p.add_argument("--batch-size", type=positive_int, default=4)
    args, job_argv = p.parse_known_args(argv)
    job_config = evaluation_job_config(args.checkpoint, job_argv)
    try:
        sample_range(job_config.training.seq_len, max(args.lookaheads))
    except ValueError as err:
        raise ConfigError(f"--lookaheads={','.join(map(str, args.lookaheads))}: {err}") from None
    with as_config_error():
        windows = heldout_windows(args.data, job_config.training.seq_len, args.windows,
                                  tokenizer=build_tokenizer(job_config))
    _, logits, device = load_checkpoint(args.checkpoint, args.device, job_config)
    results = causality_audit(logits, windows, args.lookaheads, args.samples, args.seed, args.batch_size,
                              args.progress)
    section = job_config.lighthouse
    record = {"selection": section.selection if section.enable else "dense", "steps": checkpoint_steps(args.checkpoint),
              "results": [r.as_dict() for r in results], "data": args.data, "windows": args.windows,
              "seed": args.seed, "seq_len": job_config.training.seq_len,
              **provenance(args.checkpoint, job_config, device)}
    write_record(args.out, record)
    plot_audit([{**record, "label": record_label(record)}], str(args.out.with_suffix(".png")), record["attention"])
    for r in results:
        print(f"lookahead {r.lookahead:4d}: honest {r.honest_loss:.4f} seen {r.seen_loss:.4f} "
              f"delta {r.delta:+.4f} +- {r.stderr:.4f}")
    return record


def combine(argv: list[str]) -> list[dict]:
    """Merge audit records into one list and one plot."""
    p = argparse.ArgumentParser(description="merge audit records into one list and one plot")
    p.add_argument("--combine", nargs="+", required=True, type=Path, help="records written by an audit run")
    p.add_argument("--out", required=True, type=output_file, help="output path prefix (.json and .png)")
    args = p.parse_args(argv)
    records = [read_json(path, "--combine", f"an audit record (an object with {', '.join(RECORD_KEYS)})",
                         lambda value: isinstance(value, dict) and all(key in value for key in RECORD_KEYS))
               for path in args.combine]
    rows = combine_records(records)
    write_record(args.out, rows)
    plot_audit([{**r, "label": record_label(r)} for r in records], str(args.out.with_suffix(".png")),
               "causality audit: held-out loss owed to tokens after the block")
    return rows


def main(argv: list[str] | None = None) -> dict | list[dict]:
    """`--combine` merges records, anything else audits a checkpoint."""
    argv = sys.argv[1:] if argv is None else argv
    return combine(argv) if "--combine" in argv else audit(argv)


if __name__ == "__main__":
    with exit_on_config_error():
        main()
