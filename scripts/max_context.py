"""The longest context 1, 2 and 4 GPUs train, Lighthouse and dense: a search over lengths, each probe a job.

    python scripts/max_context.py --json docs/records/max_context.json --markdown docs/records/max_context.md
        # 4 GPUs: 1, 2, 4
    python scripts/max_context.py --gpus 2 --start 1048576 --json max_context_2gpu.json        # 2 GPUs from 1M
    python scripts/max_context.py --config configs/debug.toml --gpus 1 --start 512 --resolution 256 \\
        --max-len 1024 --compile off --allow-cpu                                     # CPU smoke run

For each GPU count W in `--gpus` and each attention, trains the config (default: the paper model's stage 1
with L=3, p=4, k=2048, norm scorer, layers 0, 1, 28, 29 dense; full activation checkpointing; compiled) on W
processes with `parallelism.context_parallel_degree = W` (no FSDP), local batch 1, synthetic data, for
`--steps` steps at each length probed: doubling from `--start` while a probe trains, then bisection to
`--resolution` tokens between the longest that trained and the shortest that did not (out of memory, past
`--timeout` seconds, or another failure, recorded with its reason). Each probe is its own job, so an
out-of-memory probe cannot poison the next. Prints the markdown table of docs/context_parallel.md; `--json`
is rewritten after every probe (each probe's length, outcome, peak memory), `--resume` keeps the probes it
records and trains the others.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from eval.benchmarks.max_context import ATTENTIONS, ProbeJob, check_lengths, find_longest, table
from eval.benchmarks.throughput import switch_values
from eval.device import pick_device, require_cuda
from eval.metrics.cli import OneLineParser
from eval.options import file_to_write, positive_int, read_json
from eval.records import command_line, environment, shown_path, write_json
from recipe.logs.run_record import REPO
from recipe.train.cli import ConfigError, exit_on_config_error, parse_job_config

DEFAULT_CONFIG = REPO / "configs" / "paper" / "stage1_L3_p4_k2048_norm.toml"
# What `--resume` reads of each search in --json (the finished ones under 'results', the one under way under
# 'searching') and of each of its probes; of a finished search the table reads its outcome too.
SEARCH_KEYS = ("gpus", "attention", "probes")
FINISHED_KEYS = (*SEARCH_KEYS, "longest", "shortest_failed", "failed_because")
PROBE_KEYS = ("seq_len", "fits")


def resumed_record(path: Path) -> dict:
    """The earlier record `--resume` reads from `path` (its --json): an object with settings, finished searches
    (`results`) and perhaps the one under way (`searching`), each an object with its keys whose probes are objects
    with `PROBE_KEYS`; anything else is a ConfigError naming the file, the search or probe, and the key (not a
    KeyError once the search starts)."""
    record = read_json(path, "--resume: --json", "this script's record (an object with settings and results)",
                       lambda value: isinstance(value, dict) and {"settings", "results"} <= value.keys())

    def check(value: object, where: str, keys: tuple[str, ...]) -> None:
        """A ConfigError naming `where` unless `value` is an object with `keys`."""
        if not isinstance(value, dict):
            raise ConfigError(f"--resume: --json {path}: {where} is not an object")
        if missing := [key for key in keys if key not in value]:
            raise ConfigError(f"--resume: --json {path}: {where} has no {missing[0]!r}; --resume reads "
                              f"{', '.join(keys)} of it")

    if not isinstance(record["results"], list):
        raise ConfigError(f"--resume: --json {path}: 'results' is not an array of searches")
    searches = [(f"results[{i}]", result, FINISHED_KEYS) for i, result in enumerate(record["results"])]
    searches += [("searching", record["searching"], SEARCH_KEYS)] if "searching" in record else []
    for where, search, keys in searches:
        check(search, where, keys)
        if not isinstance(search["probes"], list):
            raise ConfigError(f"--resume: --json {path}: {where}.probes is not an array of probes")
        for i, probe in enumerate(search["probes"]):
            check(probe, f"{where}.probes[{i}]", PROBE_KEYS)
    return record


def main(argv: list[str] | None = None) -> dict:
    """Search every (GPU count, attention), print the table, write the JSON (and the table with --markdown)."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--gpus", default="1,2,4", help="GPU counts (the CP degree of each), comma-separated")
    parser.add_argument("--attentions", default=",".join(ATTENTIONS), help=f"comma-separated subset of {ATTENTIONS}")
    parser.add_argument("--start", type=positive_int, default=131072, help="the first length probed (tokens)")
    parser.add_argument("--resolution", type=positive_int, default=65536,
                        help="bisection step (tokens; a multiple of the CP geometry's length step)")
    parser.add_argument("--max-len", type=positive_int, default=16777216, help="the longest length probed")
    parser.add_argument("--steps", type=positive_int, default=2, help="training steps per probe")
    parser.add_argument("--timeout", type=positive_int, default=1800, help="seconds a probe may take")
    parser.add_argument("--ac", default="full", choices=("none", "selective", "full"))
    parser.add_argument("--compile", default="on", help="on or off: torch.compile the model")
    parser.add_argument("--json", type=file_to_write, help="write the record here (after every probe)")
    parser.add_argument("--resume", action="store_true", help="keep the probes --json already records")
    parser.add_argument("--markdown", type=file_to_write, help="write the table here")
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA too (gloo): a smoke run of a "
                        "small config (otherwise the script needs CUDA)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: train.py arguments for every probe")
    args = parser.parse_args(argv)
    args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args

    try:
        gpus = sorted({positive_int(x) for x in args.gpus.split(",")})
    except argparse.ArgumentTypeError as err:
        parser.error(f"--gpus={args.gpus}: {err}")
    attentions = args.attentions.split(",")
    if not set(attentions) <= set(ATTENTIONS):
        parser.error(f"--attentions={args.attentions}: choose from {ATTENTIONS}")
    try:
        [compile_on] = switch_values("--compile", args.compile)
    except ValueError as err:
        parser.error(str(err).replace("comma-separated values of", "one of"))
    if args.max_len < args.start:
        parser.error(f"--max-len={args.max_len} is below --start={args.start}")
    if args.resume and not args.json:
        parser.error("--resume keeps the probes of --json: name it")
    try:
        layer = parse_job_config(["--job.config_file", args.config, *args.train_args]).lighthouse.to_config()
        check_lengths(layer, args.start, args.resolution, gpus)
    except (ConfigError, ValueError) as err:
        parser.error(str(err))
    settings = {"config": shown_path(args.config), "activation_checkpointing": args.ac, "compile": compile_on,
                "steps": args.steps, "timeout_s": args.timeout, "train_args": args.train_args,
                "start": args.start, "resolution": args.resolution, "max_len": args.max_len}
    plan = [(w, attention) for w in gpus for attention in attentions]
    known: dict[tuple[int, str], dict[int, dict]] = {pair: {} for pair in plan}
    kept: list[dict] = []  # finished searches of other calls, kept in the file
    if args.resume and args.json.exists():
        before = resumed_record(args.json)
        if before["settings"] != settings:
            parser.error(f"--resume: {args.json} was searched with other settings ({before['settings']}); "
                         "resume with the same ones or write another --json")
        for result in before["results"] + ([before["searching"]] if "searching" in before else []):
            pair = (result["gpus"], result["attention"])
            if pair in known:
                known[pair] = {p["seq_len"]: p for p in result["probes"]}
            elif "longest" in result:
                kept.append(result)
    if not args.allow_cpu:
        require_cuda("--allow-cpu runs a smoke run of a small config with gloo (--config configs/debug.toml)")

    job = ProbeJob(args.config, args.ac, compile_on, args.steps, args.timeout, args.train_args)
    record = {"settings": settings, "command": command_line(), "environment": environment(pick_device("auto")),
              "results": kept}

    def save() -> None:
        shown = sorted(set(gpus) | {r["gpus"] for r in record["results"]})
        record["table"] = table(record["results"], shown, args.max_len)
        if args.json:
            write_json(args.json, record)

    with tempfile.TemporaryDirectory() as tmp:
        for w, attention in plan:
            probes = known[w, attention]
            record["searching"] = {"gpus": w, "attention": attention, "probes": list(probes.values())}

            def on_probe(result: dict, w=w, attention=attention) -> None:
                result["measured_by"] = {key: record[key] for key in ("command", "environment")}
                record["searching"]["probes"].append(result)
                print(f"{w} GPU(s) {attention:10s} {result}", flush=True)
                save()

            try:
                result = find_longest(job, w, attention, args.start, args.resolution, args.max_len, Path(tmp),
                                      probes, on_probe)
            except RuntimeError as err:
                print(f"error: {err}", file=sys.stderr, flush=True)
                raise SystemExit(1) from None
            del record["searching"]
            record["results"].append(result)
            save()
    print(f"\n{args.config}, search from {args.start:,}, resolution {args.resolution:,}, {args.steps} "
          f"step(s) a probe\n" + " | ".join(f"{k} {v}" for k, v in record["environment"].items()) + "\n"
          + record["table"])
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(record["table"] + "\n")
    return record


if __name__ == "__main__":
    with exit_on_config_error():
        main()
