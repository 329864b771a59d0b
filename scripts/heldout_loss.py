"""Held-out loss of a checkpoint: with the command line's attention setting and, if that is Lighthouse,
also with dense attention in every layer on the same weights (how much the weights depend on the sparsity).

    python scripts/heldout_loss.py --checkpoint outputs/replicate/lighthouse/checkpoint/step-500 \\
        --data 'outputs/replicate/corpus/heldout/*.jsonl' --windows 32 --out outputs/replicate/eval/stage1 \\
        --job.config_file configs/replicate/small.toml

Windows of `training.seq_len + 1` tokens cut from the held-out files as in training (`eval.heldout`).
Writes `<out>.json`: {"loss": {"lighthouse": ..., "dense": ...}, "windows": ..., provenance}; with
`--by-position`, also "by_position": {"edges": [0, 64, 256, ...], "lighthouse": [...], "dense": [...]}, the
mean loss of the positions between successive edges (does the model use far context?).
"""
from __future__ import annotations

import sys

from recipe.compat import install

install()  # the CPU compatibility layer, before torchtitan is imported

from eval.checkpoint import parse_job_config
from eval.cli import evaluation_parser, load_checkpoint
from eval.heldout import heldout_windows, setting_losses
from eval.records import provenance, write_record
from recipe.cli import as_config_error, exit_on_config_error


def main(argv: list[str] | None = None) -> dict:
    """Score the checkpoint on the held-out windows; write and print the losses."""
    p = evaluation_parser(__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="glob of held-out files (.txt/.jsonl/.json/.parquet)")
    p.add_argument("--windows", type=int, default=32, help="number of windows to score")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--by-position", action="store_true", help="also the loss per log-spaced position bucket")
    args, job_argv = p.parse_known_args(argv)
    job_config = parse_job_config(job_argv)
    with as_config_error():
        windows = heldout_windows(args.data, job_config.training.seq_len, args.windows)
    model, logits, device = load_checkpoint(args.checkpoint, args.device, job_config)
    loss, by_position = setting_losses(model, logits, windows, job_config.lighthouse.enable, args.batch_size, device,
                                       args.by_position, args.progress)
    record = {"loss": loss, "data": args.data, "windows": args.windows, "seq_len": job_config.training.seq_len,
              **({"by_position": by_position} if by_position else {}),
              **provenance(args.checkpoint, job_config, device)}
    path = write_record(args.out, record)
    print("held-out loss " + "  ".join(f"{k}: {v:.4f}" for k, v in loss.items()) + f" -> {path}")
    return record


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
