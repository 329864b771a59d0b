"""Held-out loss of a checkpoint: with the command line's attention setting and, if that is Lighthouse,
also with dense attention in every layer on the same weights (how much the weights depend on the sparsity).

    python scripts/heldout_loss.py --checkpoint outputs/replicate/lighthouse/checkpoint/step-500 \\
        --data 'outputs/replicate/corpus/heldout/*.jsonl' --windows 32 --out outputs/replicate/eval/stage1 \\
        --job.config_file configs/replicate/small.toml

The model and `training.seq_len` come from the record of the run that wrote the checkpoint, as for
scripts/export_hf.py (eval/checkpoint_run.py); job arguments override it (`--lighthouse.no-enable`), and a
checkpoint without run records needs `--job.config_file` of its run.

Windows of `training.seq_len + 1` tokens cut from the held-out files as in training (`eval.metrics.heldout`).
Writes `<out>.json`: {"loss": {"lighthouse": ..., "dense": ...}, "windows": ..., provenance}; with
`--by-position`, also "by_position": {"edges": [0, 64, 256, ...], "lighthouse": [...], "dense": [...]}, the
mean loss of the positions between successive edges (does the model use far context?).

With `--documents N` it scores the first N documents whole instead, with dense attention, as lm-eval's rolling
log-likelihood scores them on the exported model (`lighthouse_docs`, `wikitext`): {"loss": {"dense": nats per
byte}, "bits_per_byte": ..., "documents": N, "bytes": ...}. Text is tokenized by the run's tokenizer (bytes, or
the Hugging Face tokenizer of `[model] hf_assets_path`); per byte, the numbers compare across tokenizers.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from eval.checkpoint_run import check_trained_tokenizer
from eval.metrics.cli import checkpoint_job_config, evaluation_parser, load_checkpoint
from eval.metrics.heldout import document_loss, heldout_documents, heldout_windows, setting_losses
from eval.options import positive_int
from eval.records import provenance, write_record
from recipe.data.tokenizer import build_tokenizer, tokenizer_fingerprint, tokenizer_setting
from recipe.train.cli import as_config_error, exit_on_config_error


def main(argv: list[str] | None = None) -> dict:
    """Score the checkpoint on the held-out windows (or whole documents); write and print the losses."""
    p = evaluation_parser(__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="glob of held-out files (.txt/.jsonl/.json/.parquet)")
    p.add_argument("--windows", type=positive_int, default=32, help="number of windows to score")
    p.add_argument("--documents", type=positive_int, help="score this many documents whole, as lm-eval's rolling "
                   "log-likelihood does (dense attention), instead of windows")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--by-position", action="store_true", help="also the loss per log-spaced position bucket")
    args, job_argv = p.parse_known_args(argv)
    if args.documents is not None and args.by_position:
        p.error("--by-position buckets the positions of windows; it does not go with --documents")
    job_config, record_folder = checkpoint_job_config(args.checkpoint, job_argv)
    if args.documents is not None:  # scored dense, as lm-eval scores the export; the record says so
        job_config.lighthouse.enable = False
    seq_len = job_config.training.seq_len
    with as_config_error():
        tokenizer = build_tokenizer(job_config)
    check_trained_tokenizer(Path(args.checkpoint), record_folder, tokenizer_fingerprint(tokenizer),
                            tokenizer_setting(job_config.model))
    with as_config_error():
        if args.documents is None:
            windows = heldout_windows(args.data, seq_len, args.windows, tokenizer=tokenizer)
        else:
            documents = heldout_documents(args.data, args.documents)
    model, logits, device = load_checkpoint(args.checkpoint, args.device, job_config)
    record: dict = {"data": args.data, "seq_len": seq_len}
    if args.documents is None:
        loss, by_position = setting_losses(model, logits, windows, job_config.lighthouse.enable, args.batch_size,
                                           device, args.by_position, args.progress)
        record |= {"loss": loss, "windows": args.windows, **({"by_position": by_position} if by_position else {})}
    else:
        nats, count = document_loss(logits, documents, seq_len, device, args.progress, tokenizer)
        loss = {"dense": nats}
        record |= {"loss": loss, "bits_per_byte": nats / math.log(2), "documents": args.documents, "bytes": count}
    record |= provenance(args.checkpoint, job_config, device)
    path = write_record(args.out, record)
    print(summary_line(loss, record.get("bits_per_byte")) + f" -> {path}")
    return record


def summary_line(loss: dict[str, float], bits_per_byte: float | None) -> str:
    """The losses with their unit: nats per token over windows; nats and bits per byte over whole documents."""
    if bits_per_byte is None:
        return "held-out loss, nats/token: " + "  ".join(f"{k} {v:.4f}" for k, v in loss.items())
    return f"held-out loss, dense: {loss['dense']:.4f} nats/byte, {bits_per_byte:.4f} bits/byte"


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
