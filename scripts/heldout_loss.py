"""Held-out loss of a checkpoint: with the command line's attention setting and, if that is Lighthouse,
also with dense attention in every layer on the same weights (how much the weights depend on the sparsity).

    python scripts/heldout_loss.py --checkpoint outputs/replicate/lighthouse/checkpoint/step-500 \\
        --data 'outputs/replicate/corpus/heldout/*.jsonl' --windows 32 --out outputs/replicate/eval/stage1 \\
        --job.config_file configs/replicate/small.toml

Windows of `training.seq_len + 1` tokens cut from the held-out files as in training (`eval.heldout`).
Writes `<out>.json`: {"loss": {"lighthouse": ..., "dense": ...}, "windows": ..., provenance}.
"""
from __future__ import annotations

import json
import sys

from eval_common import load, parser, provenance

from eval.heldout import heldout_windows, mean_loss


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="glob of held-out files (.txt/.jsonl/.json/.parquet)")
    p.add_argument("--windows", type=int, default=32, help="number of windows to score")
    p.add_argument("--batch-size", type=int, default=1)
    args, job_argv = p.parse_known_args(argv)
    job_config, model, logits, device = load(args, job_argv)
    windows = heldout_windows(args.data, job_config.training.seq_len, args.windows)

    loss = {}
    if job_config.lighthouse.enable:
        loss["lighthouse"] = mean_loss(logits, windows, args.batch_size, device)
        model.set_lighthouse_enabled(False)
    loss["dense"] = mean_loss(logits, windows, args.batch_size, device)
    record = {"loss": loss, "data": args.data, "windows": args.windows, "seq_len": job_config.training.seq_len,
              **provenance(args, job_config, device)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    print("held-out loss " + "  ".join(f"{k}: {v:.4f}" for k, v in loss.items()) + f" -> {args.out.with_suffix('.json')}")
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
