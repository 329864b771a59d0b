"""Per-rank training throughput under context parallelism: CP degree W against W = 1 at equal tokens per
rank, Lighthouse against dense at the same geometry.

    python scripts/cp_throughput.py --json docs/cp_throughput.json --plot docs/cp_throughput.png   # 2 GPUs
    python scripts/cp_throughput.py --config configs/debug.toml --tokens-per-rank 512 --steps 3 \\
        --topk 64 --ac none --allow-cpu                                            # CPU smoke run, gloo
    python scripts/cp_throughput.py --records docs/cp_throughput.json --plot docs/cp_throughput.png   # replot
    python scripts/cp_throughput.py --cp 1,4 --topk 2048 --attentions lighthouse -- --lighthouse.dense_layers
        # every layer Lighthouse: arguments after -- go to train.py

For every degree W in `--cp` and each attention, trains the config (default: the paper's L=3, p=4, k=1536
stage 1, full activation checkpointing; its 12 tiles split over 2W chunks for W = 1, 2, 3, 6) on W
processes with `parallelism.context_parallel_degree = W` and `seq_len = W * --tokens-per-rank`, so every
rank holds the same number of tokens. Everything else as `train_throughput.py` (local batch 1, synthetic
data, no checkpoints, each variant its own job; `--compile` compiles the model), without selection statistics (an extra
selection pass on the timed last step). torchtitan's tok/s is per rank (tokens of the step / (time * CP degree)).
Reports, per W: tok/s per rank, the share of the W = 1 throughput kept, and the Lighthouse speedup over
dense.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from recipe.compat import install

install()  # the CPU compatibility layer, before torchtitan is imported

from eval.cp_throughput import ATTENTIONS, CpThroughputJob, measure, plot, report
from eval.device import require_cuda
from eval.throughput import DEFAULT_CONFIG, positive_int, too_few_steps


def main(argv: list[str] | None = None) -> list[dict]:
    """Measure (or read with --records) the CP variants, print the table, write the JSON and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--tokens-per-rank", type=positive_int, default=49152,
                        help="the default makes CP=2 the paper's stage-1 length, 98,304")
    parser.add_argument("--cp", default="1,2", help="CP degrees, comma-separated; 1 is the baseline")
    parser.add_argument("--steps", type=positive_int, default=6,
                        help="steps per variant; all after the first two are timed")
    parser.add_argument("--ac", default="full", choices=("none", "selective", "full"))
    parser.add_argument("--topk", type=positive_int,
                        help="override lighthouse.topk (topk/tile_budget must split over 2W chunks)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model in every variant")
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    parser.add_argument("--records", type=Path, help="read records from this JSON instead of training")
    parser.add_argument("--attentions", default=",".join(ATTENTIONS), help="comma-separated subset of "
                        f"{ATTENTIONS}")
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA too (gloo): a smoke run of a "
                        "small config (otherwise the script needs CUDA, so the paper model is never trained on a CPU "
                        "by mistake)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: train.py arguments for every variant")
    args = parser.parse_args(argv)
    args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args

    if args.records:
        records = json.loads(args.records.read_text())
    else:
        try:
            degrees = sorted({positive_int(x) for x in args.cp.split(",")})
        except argparse.ArgumentTypeError as err:
            parser.error(f"--cp={args.cp}: {err}")
        if 1 not in degrees:
            parser.error(f"--cp={args.cp}: include 1, the baseline every degree is compared with")
        if error := too_few_steps(args.steps):
            parser.error(error)
        attentions = args.attentions.split(",")
        if not set(attentions) <= set(ATTENTIONS):
            parser.error(f"--attentions={args.attentions}: choose from {ATTENTIONS}")
        if not args.allow_cpu:
            require_cuda("--allow-cpu runs a smoke run of a small config with gloo (--config configs/debug.toml)")
        job = CpThroughputJob(args.config, args.tokens_per_rank, args.steps, args.ac, args.topk, args.compile,
                              args.train_args)
        records = measure(job, degrees, attentions)

    print(report(records))
    if args.json and not args.records:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    if args.plot:
        plot(records, args.plot)
    return records


if __name__ == "__main__":
    main()
