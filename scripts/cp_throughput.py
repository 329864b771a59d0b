"""Per-rank training throughput under context parallelism: Lighthouse against dense at the same geometry, eager
and compiled, with variants of `dense_layers`, CP degree W against W = 1 at equal tokens per rank, and where
the Lighthouse step goes.

    python scripts/cp_throughput.py --json docs/records/cp_throughput.json --plot docs/records/cp_throughput.png
        # 2 GPUs
    python scripts/cp_throughput.py --config configs/debug.toml --tokens-per-rank 512 --steps 3 \\
        --topk 64 --ac none --allow-cpu                                            # CPU smoke run, gloo
    python scripts/cp_throughput.py --records docs/records/cp_throughput_k2048.json \
        --plot outputs/cp_throughput_k2048.png                                    # replot a record, no GPU
    python scripts/cp_throughput.py --cp 1,4 --topk 2048 --attentions lighthouse -- --lighthouse.dense_layers
        # every layer Lighthouse: arguments after -- go to train.py
    python scripts/cp_throughput.py --config configs/long_context/stage1_L3_p4_k2048_norm_1m_cp2.toml \\
        --tokens-per-rank 524288 --cp 2 --steps 3 --compile off,on --dense-layers 0,1,28,29 \\
        --dense-layers 0 --dense-layers none --layer-times --json docs/records/cp_throughput_1m_cp2.json \\
        --plot docs/records/cp_throughput_1m_cp2.png --resume                             # 1M tokens on 2 GPUs
    python scripts/cp_throughput.py --config configs/long_context/stage1_L3_p4_k2048_norm_1m_cp2.toml \\
        --tokens-per-rank 524288 --cp 2 --steps 3 --compile on --stage2 3 \\
        --json docs/records/cp_stage2_1m_cp2.json                                          # stage 2 at 1M

For every degree W in `--cp`, each compile setting (`--compile off,on`) and each attention, trains the config
(default: the paper's L=3, p=4, k=1536 stage 1, full activation checkpointing; its 12 tiles split over 2W
chunks for W = 1, 2, 3, 6) on W processes with `parallelism.context_parallel_degree = W` and
`seq_len = W * --tokens-per-rank`, so every rank holds the same number of tokens; Lighthouse once per
`--dense-layers` set (`0,1,28,29`, `0`, `none`; default the config's), dense once. Everything else as
`train_throughput.py` (local batch 1, synthetic data, no checkpoints, each variant its own job), without
selection statistics (an extra selection pass on the timed last step). torchtitan's tok/s is per rank
(tokens of the step / (time * CP degree)). Reports, per variant: tok/s per rank and peak memory, the share
of the W = 1 throughput kept (with 1 in `--cp`), and the Lighthouse speedup over dense.

`--layer-times` times every transformer block's forward and backward inside the job (CUDA events;
`eval/benchmarks/layer_times.py`) and reports where each step goes: dense layers, Lighthouse layers, the rest.
`--json` is rewritten after every variant; `--resume` keeps the variants an earlier run of the same settings
recorded there and trains the others. `--stage2 N` instead trains Lighthouse for `--steps` steps with a
full checkpoint at the last, then N dense steps resumed from it (model, optimizer, LR schedule, data, step),
at the one degree in `--cp`, and records both.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from eval.benchmarks.cp_throughput import (ATTENTIONS, REPORT_KEYS, CpThroughputJob, measure, measure_stage2,
                                measured_runs, plot, report, run_keys, stage2_report)
from eval.benchmarks.throughput import DEFAULT_CONFIG, WARMUP_STEPS, switch_values, too_few_steps
from eval.device import require_cuda
from eval.metrics.cli import OneLineParser
from eval.options import file_to_write, non_negative_int, output_file, positive_int, read_json
from eval.records import write_json
from recipe.toml_config import get_key
from recipe.train.cli import ConfigError, exit_on_config_error

# What `--resume` reads of each earlier record besides the settings it compares (`measured_runs`).
RESUMED_KEYS = ("cp_degree", "compile", "runs")
_ABSENT = object()  # what `get_key` gives for a key a record lacks (a present key may hold null)


def dense_layer_set(text: str) -> tuple[int, ...] | None:
    """argparse type of `--dense-layers`: "config" (None: the config's), "none" (every layer Lighthouse) or
    comma-separated layer numbers."""
    if text == "config":
        return None
    if text == "none":
        return ()
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not config, none or comma-separated layer numbers") from None
    if any(layer < 0 for layer in layers):
        raise argparse.ArgumentTypeError(f"{text!r}: layer numbers are >= 0")
    return layers


def require_keys(record: dict, keys: tuple[str, ...], at: str, holder: str = "") -> None:
    """ConfigError, `at` naming the record, unless it has each of `keys` (dotted) in the object at `holder` (the
    record itself where "")."""
    prefix = f"{holder}." if holder else ""
    if missing := [key for key in keys if get_key(record, prefix + key, _ABSENT) is _ABSENT]:
        raise ConfigError(f"{at} has no {prefix + missing[0]!r}; {holder or 'every record'} needs {', '.join(keys)}")


def read_records(path: Path, flag: str, keys: tuple[str, ...], non_empty: bool = False) -> list[dict]:
    """This script's records in `path`, named by `flag`: an array (`non_empty`: of at least one) of objects with
    `keys` (what is read of them; 'runs' among them; "environment.device" is a key of the object at "environment"),
    whose runs are objects with what `report` and `plot` read of them (`run_keys`; a resumed run is reported
    too); anything else is a ConfigError naming the file and, for a record, its number and key (not a traceback
    from whatever reads them)."""
    what = f"this script's records ({'a non-empty' if non_empty else 'an'} array of objects)"
    records = read_json(path, flag, what, lambda value: isinstance(value, list) and (len(value) > 0 or not non_empty)
                        and all(isinstance(record, dict) for record in value))
    for number, record in enumerate(records, 1):
        at = f"{flag} {path}: record {number}"
        require_keys(record, keys, at)
        runs = record["runs"]
        if not isinstance(runs, dict) or not all(isinstance(run, dict) for run in runs.values()):
            raise ConfigError(f"{at}'s 'runs' is not an object of runs (each an object)")
        for below, needed in run_keys(runs).items():
            require_keys(record, needed, at, f"runs.{below}")
    return records


def main(argv: list[str] | None = None) -> list[dict] | dict:
    """Measure (or read with --records) the CP variants, print the tables, write the JSON and the plot."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--tokens-per-rank", type=positive_int, default=49152,
                        help="the default makes CP=2 the paper's stage-1 length, 98,304")
    parser.add_argument("--cp", default="1,2", help="CP degrees, comma-separated; 1 is the baseline of 'kept of CP=1'")
    parser.add_argument("--steps", type=positive_int, default=6,
                        help="steps per variant; all after the first --warmup are timed")
    parser.add_argument("--warmup", type=non_negative_int, default=WARMUP_STEPS,
                        help="steps not timed (compile's second step is still a warm-up; 0 for a one-step eager run)")
    parser.add_argument("--ac", default="full", choices=("none", "selective", "full"))
    parser.add_argument("--topk", type=positive_int,
                        help="override lighthouse.topk (topk/tile_budget must split over 2W chunks)")
    parser.add_argument("--compile", nargs="?", const="on", default="off",
                        help="torch.compile settings, comma-separated: off, on (off,on: both; alone: on)")
    parser.add_argument("--dense-layers", action="append", type=dense_layer_set, metavar="LAYERS",
                        help="Lighthouse's dense layers, once per set: comma-separated numbers, none or config "
                        "(the default)")
    parser.add_argument("--layer-times", action="store_true",
                        help="time every block in the job: dense layers, Lighthouse layers, the rest")
    parser.add_argument("--stage2", type=positive_int, metavar="STEPS",
                        help="train Lighthouse --steps steps, then STEPS dense steps resumed from its checkpoint")
    parser.add_argument("--json", type=file_to_write, help="write the records here (after every variant)")
    parser.add_argument("--resume", action="store_true", help="keep the variants --json already records")
    parser.add_argument("--plot", type=output_file, help="write a PNG bar chart here")
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
        records = read_records(args.records, "--records", REPORT_KEYS, non_empty=True)
        print(report(records))
        if args.plot:
            plot(records, args.plot)
        return records

    try:
        degrees = sorted({positive_int(x) for x in args.cp.split(",")})
        compile_modes = tuple(switch_values("--compile", args.compile))
    except (argparse.ArgumentTypeError, ValueError) as err:
        parser.error(str(err) if isinstance(err, ValueError) else f"--cp={args.cp}: {err}")
    if error := too_few_steps(args.steps, args.warmup):
        parser.error(error)
    attentions = args.attentions.split(",")
    if not set(attentions) <= set(ATTENTIONS):
        parser.error(f"--attentions={args.attentions}: choose from {ATTENTIONS}")
    if args.stage2 is not None:
        if len(degrees) != 1 or len(compile_modes) != 1 or len(args.dense_layers or [None]) != 1:
            parser.error(f"--stage2={args.stage2}: give one --cp degree, one --compile setting and at most one "
                         "--dense-layers set")
        if error := too_few_steps(args.stage2, args.warmup):
            parser.error(error.replace("--steps", "--stage2"))
        if args.plot or args.resume or args.layer_times:
            parser.error(f"--stage2={args.stage2} records the two runs only: leave out --plot, --resume, --layer-times")
    if args.resume and not args.json:
        parser.error("--resume keeps the variants of --json: name it")
    job = CpThroughputJob(args.config, args.tokens_per_rank, args.steps, args.ac, args.topk, compile_modes,
                          tuple(args.dense_layers or [None]), args.layer_times, args.train_args, args.warmup)
    done = {}
    if args.resume and args.json.exists():
        records = read_records(args.json, "--resume: --json", RESUMED_KEYS)
        try:
            done = measured_runs(records, job)
        except ValueError as err:
            parser.error(f"--resume: {args.json}: {err}")
    if not args.allow_cpu:
        require_cuda("--allow-cpu runs a smoke run of a small config with gloo (--config configs/debug.toml)")

    if args.stage2 is not None:
        record = measure_stage2(job, degrees[0], args.stage2)
        print(stage2_report(record))
        if args.json:
            write_json(args.json, record)
        return record

    save = (lambda records: write_json(args.json, records)) if args.json else None
    records = measure(job, degrees, attentions, done, save)
    print(report(records))
    if args.json:
        write_json(args.json, records)
    if args.plot:
        plot(records, args.plot)
    return records


if __name__ == "__main__":
    with exit_on_config_error():
        main()
