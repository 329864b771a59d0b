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

import json
import sys

from eval_common import load, parser, provenance

from eval.heldout import bucket_means, heldout_windows, position_edges, position_losses


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="glob of held-out files (.txt/.jsonl/.json/.parquet)")
    p.add_argument("--windows", type=int, default=32, help="number of windows to score")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--by-position", action="store_true", help="also the loss per log-spaced position bucket")
    args, job_argv = p.parse_known_args(argv)
    job_config, model, logits, device = load(args, job_argv)
    windows = heldout_windows(args.data, job_config.training.seq_len, args.windows)

    loss, by_position = {}, {"edges": position_edges(job_config.training.seq_len)}

    def score(name: str) -> None:
        per_position = position_losses(logits, windows, args.batch_size, device)
        loss[name] = per_position.mean().item()
        if args.by_position:
            by_position[name] = bucket_means(per_position, by_position["edges"])

    if job_config.lighthouse.enable:
        score("lighthouse")
        model.set_lighthouse_enabled(False)
    score("dense")
    record = {"loss": loss, "data": args.data, "windows": args.windows, "seq_len": job_config.training.seq_len,
              **({"by_position": by_position} if args.by_position else {}), **provenance(args, job_config, device)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    print("held-out loss " + "  ".join(f"{k}: {v:.4f}" for k, v in loss.items()) + f" -> {args.out.with_suffix('.json')}")
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
