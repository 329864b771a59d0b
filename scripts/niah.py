"""Needle in a haystack on a checkpoint of the recipe's model, with the attention setting of the command line.

    python scripts/niah.py --checkpoint outputs/replicate/dense/checkpoint/step-800 \\
        --lengths 2048,4096,8192,16384 --out docs/records/niah_dense \\
        --job.config_file configs/replicate/small.toml --lighthouse.no-enable

The job arguments after the script's own options choose the model (`model.name`, `model.flavor`) and the
attention (`--lighthouse.enable`/`--lighthouse.no-enable`, `--lighthouse.levels`, `.pool`, `.topk`, ...); without
`--job.config_file` they override the job of the checkpoint's run record (eval/checkpoint_run.py).
Protocol (`eval.metrics.niah`): one passkey digit in random alphanumeric filler at each depth, one forward pass,
argmax over the ten digit tokens at the last position, each cell the mean over the ten digits.
Writes `<out>.json` (grid, mean and provenance) and `<out>.png` (heatmap).
"""
from __future__ import annotations

import sys

from eval.checkpoint import check_lengths
from eval.checkpoint_record import lighthouse_setting
from eval.metrics.cli import evaluation_job_config, evaluation_parser, load_checkpoint
from eval.metrics.niah import DEPTHS, check_depths, check_prompt_lengths, plot_heatmap, run_niah, text_encoder
from eval.options import int_list, naming_option, positive_int_list
from eval.records import provenance, write_record
from recipe.data.tokenizer import build_tokenizer
from recipe.train.cli import as_config_error, exit_on_config_error


def main(argv: list[str] | None = None) -> dict:
    """Run the NIAH grid on the checkpoint; write the record and the heatmap, print the mean."""
    p = evaluation_parser(__doc__.split("\n\n")[0])
    p.add_argument("--lengths", required=True, type=positive_int_list, help="context lengths in tokens, e.g. 2048,4096")
    p.add_argument("--depths", default=list(DEPTHS), type=int_list, help="needle depths in percent")
    p.add_argument("--seed", type=int, default=0, help="seed of the filler text")
    p.add_argument("--title", help="heatmap title (default: checkpoint and attention setting)")
    args, job_argv = p.parse_known_args(argv)
    job_config = evaluation_job_config(args.checkpoint, job_argv)
    with as_config_error():
        encode = text_encoder(build_tokenizer(job_config))
    with naming_option("--lengths", args.lengths):
        check_prompt_lengths(encode, args.lengths)
        check_lengths(job_config, args.lengths)
    with naming_option("--depths", args.depths):
        check_depths(args.depths)
    _, logits, device = load_checkpoint(args.checkpoint, args.device, job_config)
    result = run_niah(logits, encode, args.lengths, args.depths, seed=args.seed, device=device,
                      progress=args.progress)
    record = {**result.to_dict(), "seed": args.seed, **provenance(args.checkpoint, job_config, device)}
    path = write_record(args.out, record)
    plot_heatmap(result, str(args.out.with_suffix(".png")), args.title or lighthouse_setting(job_config))
    print(f"NIAH mean {result.mean:.3f} ({lighthouse_setting(job_config)}) -> {path}")
    return record


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
