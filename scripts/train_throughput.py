"""Stage-1 training throughput and peak memory of one model with Lighthouse and with dense SDPA, one device.

    python scripts/train_throughput.py --json docs/records/train_throughput.json          # the paper model, seq 98,304
    python scripts/train_throughput.py --compile off,on --ac full                # also under torch.compile
    python scripts/train_throughput.py --allow-cpu --config configs/debug.toml   # CPU smoke run: seq 512, 3 steps
    python scripts/train_throughput.py --seq-len 8192 --compile on --ac full --colocate-autograd off,on
    python scripts/train_throughput.py --vocab-size 131072 --json docs/records/train_throughput_vocab128k.json
    python scripts/train_throughput.py --compile on --ac full --backend cudnn,flash_attn   # cuDNN against FA4
    python scripts/train_throughput.py --compile on --ac full --dense-layers "0,1,28,29;0,29;0;"
        # per dense-layer choice
    python scripts/train_throughput.py --vocab-size 128256 -- --loss.implementation fused  # train.py arguments after --

For each activation-checkpointing mode (`--ac none,full`) and compile setting (`--compile off,on`:
torchtitan's per-block `torch.compile` of the model, Lighthouse layers included), trains the config
(default: the paper's L=3, p=4, k=1536 norm-scorer stage 1) with Lighthouse on the fused kernels and with
dense attention (cuDNN SDPA on CUDA), and for each placement of the host threads (`--colocate-autograd off,on`:
`[host] colocate_autograd`), same settings otherwise: local batch 1, synthetic data, no
checkpoints, no selection statistics (their extra selection pass stays out of the timed steps),
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`. Each variant is its own process (an out-of-memory run
is recorded as such and the others still run). tok/s is torchtitan's per-step tok/s over the steps after
the first two (warm-up under torch.compile; `eval.benchmarks.throughput.WARMUP_STEPS`), peak reserved memory
torchtitan's own.

Then it times one attention call of the model's shape (B 1, the model's heads and head dim) with the
Lighthouse call the model used and with dense SDPA, forward and forward + backward, and turns that into
the Amdahl view: the share of the dense step spent in the attention of the layers that run Lighthouse,
the whole-model ceiling if that attention cost nothing, and the speedup predicted from the per-layer
speedup. Prints markdown tables; `--json` writes one record per checkpointing mode.

`--backend B,...` trains each variant once per attention backend B (cudnn, flash_attn or auto), set as both
`[lighthouse] backend` (the Lighthouse layers) and `[lighthouse] dense_backend` (every dense attention: the
dense variant, the config's dense layers); without it, the config's own settings.

`--tokenizer DIR` trains with that tokenizer's vocabulary; `--vocab-size N` trains with a byte-level BPE of exactly N
entries built here (`recipe.data.bpe`, on the synthetic corpus, filled with reserved tokens) instead of the byte
tokenizer: what a larger output layer costs at long context, beside a run without it. `--dense-layers "A;B;..."` trains
Lighthouse once per choice of
`[lighthouse] dense_layers` (each a comma-separated list, empty for none), beside one dense run; arguments after
`--` go to every variant's train.py.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import get_args, get_type_hints

import recipe.train.train_spec  # noqa: F401  (registers the llama3_lighthouse TrainSpec)
import torch
from torchtitan.config import ConfigManager
from torchtitan.config.job_config import ActivationCheckpoint
from torchtitan.protocols.train_spec import get_train_spec

from eval.device import require_cuda
from eval.records import environment, shown_path, write_json
from eval.benchmarks.throughput import (BACKENDS, DEFAULT_CONFIG, WARMUP_STEPS, amdahl, attention_times, fmt, job_args,
                                        run_variant, switch_values, too_few_steps)
from eval.options import file_to_write, positive_int
from recipe.data.bpe import train_bpe
from recipe.data.loader import synthetic_document
from recipe.data.tokenizer import build_tokenizer, model_vocab_size
from recipe.train.cli import exit_on_config_error, parse_job_config

CPU_STEPS = 3  # the first two are not timed


def dense_layer_choices(text: str) -> list[list[int]]:
    """'0,1,28,29;0;' -> [[0, 1, 28, 29], [0], []]: `[lighthouse] dense_layers` choices, one per Lighthouse variant."""
    try:
        return [[int(i) for i in part.split(",")] if part.strip() else [] for part in text.split(";")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not ';'-separated lists of layer indices, e.g. '0,1,28,29;0;'")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--seq-len", type=positive_int,
                        help="tokens per sequence (default: the config's training.seq_len, 98,304 for the paper's)")
    parser.add_argument("--steps", type=positive_int,
                        help=f"steps per variant; all after the first two are timed (default: 8, on a CPU "
                             f"{CPU_STEPS})")
    parser.add_argument("--ac", help="activation checkpointing modes, comma-separated (default: none,full; on a "
                                     "CPU none)")
    parser.add_argument("--compile", default="off", help="torch.compile settings, comma-separated: off, on")
    parser.add_argument("--colocate-autograd", default="off",
                        help="[host] colocate_autograd settings, comma-separated: off, on")
    parser.add_argument("--backend", help="attention backends, comma-separated, each set as [lighthouse] backend "
                                          "and dense_backend: cudnn, flash_attn, auto (default: the config's)")
    parser.add_argument("--vocab-size", type=positive_int,
                        help="train with a BPE tokenizer of this many entries built locally (default: bytes, 258)")
    parser.add_argument("--tokenizer", type=Path,
                        help="train with this Hugging Face tokenizer folder (e.g. from scripts/make_tokenizer.py)")
    parser.add_argument("--dense-layers", type=dense_layer_choices,
                        help='Lighthouse variants by [lighthouse] dense_layers, ";"-separated lists '
                             '(e.g. "0,1,28,29;0;" '
                             "for those, [0] and []); default: the config's")
    parser.add_argument("--json", type=file_to_write, help="write the records here")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: train.py arguments for every variant")
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA too: a smoke run of a small config "
                        "(otherwise the script needs CUDA, so the paper model is never trained on a CPU by mistake)")
    args = parser.parse_args(argv)
    args.train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    on_cpu = not torch.cuda.is_available()  # the smoke run: small unless asked otherwise
    args.steps = args.steps or (CPU_STEPS if on_cpu else 8)
    args.ac = args.ac or ("none" if on_cpu else "none,full")
    if error := too_few_steps(args.steps):
        parser.error(error)
    try:
        switches = {name: switch_values(f"--{name.replace('_', '-')}", getattr(args, name))
                    for name in ("compile", "colocate_autograd")}
    except ValueError as err:
        parser.error(str(err))
    backends = args.backend.split(",") if args.backend else [None]
    if not set(backends) <= {None, *BACKENDS}:
        parser.error(f"--backend={args.backend!r}: comma-separated values of {', '.join(BACKENDS)}")
    ac_modes = get_args(get_type_hints(ActivationCheckpoint)["mode"])
    if bad := [mode for mode in args.ac.split(",") if mode not in ac_modes]:
        parser.error(f"--ac={args.ac!r}: {bad[0]!r} is no activation checkpointing mode; comma-separated values of "
                     f"{', '.join(ac_modes)}")
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer.json").is_file():
        parser.error(f"--tokenizer={str(args.tokenizer)!r} holds no tokenizer.json (a Hugging Face tokenizer folder, "
                     "such as scripts/make_tokenizer.py writes)")
    modes = [(ac, c, h, b) for ac in args.ac.split(",") for c in switches["compile"]
             for h in switches["colocate_autograd"] for b in backends]
    job = parse_job_config(["--job.config_file", args.config,  # a mistake in it is named before CUDA is asked for
                            *(["--training.seq_len", str(args.seq_len)] if args.seq_len else [])])
    if not args.allow_cpu:
        require_cuda("--allow-cpu runs a smoke run of a small config (--config configs/debug.toml)")

    args.seq_len = job.training.seq_len
    choices = args.dense_layers or [list(job.lighthouse.dense_layers)]
    spec = get_train_spec("llama3_lighthouse")
    model_args = copy.deepcopy(spec.model_args[job.model.flavor])
    model_args.update_from_config(job)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    runs: dict[tuple[str, str, bool, bool, str | None], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_args = ["--model.hf_assets_path", str(args.tokenizer)] if args.tokenizer else []
        if args.tokenizer:
            args.vocab_size = model_vocab_size(build_tokenizer(ConfigManager().parse_args(tokenizer_args)))
        elif args.vocab_size:
            texts = (synthetic_document(0, i, 100_000) for i in range(64))
            tokenizer_args = ["--model.hf_assets_path", str(train_bpe(texts, args.vocab_size, Path(tmp) / "bpe",
                                                                      exact=True))]
        variants = [("lighthouse" if args.dense_layers is None
                     else f"lighthouse_dense{json.dumps(c).replace(' ', '')}", c)
                    for c in choices] + [("dense", None)]
        for mode in modes:
            ac, compile_on, colocate, backend = mode
            for name, dense_layers in variants:
                lighthouse = dense_layers is not None
                print(f"train_throughput: training {name} ac={ac} compile={compile_on} colocate_autograd={colocate}, "
                      f"{f'backend {backend}, ' if backend else ''}seq_len {args.seq_len}, {args.steps} steps "
                      f"({len(runs) + 1} of {len(variants) * len(modes)})", file=sys.stderr, flush=True)
                folder = Path(tmp) / "_".join((name, ac, "compile" if compile_on else "eager",
                                               "colocated" if colocate else "free", backend or "config"))
                layers = ["--lighthouse.dense_layers", *map(str, dense_layers)] if lighthouse else []
                backend_args = (["--lighthouse.backend", backend, "--lighthouse.dense_backend", backend]
                                if backend else [])
                argv_variant = (job_args(args.config, args.seq_len, args.steps, lighthouse, ac, compile_on, folder,
                                         colocate) + tokenizer_args + layers + backend_args + args.train_args)
                runs[(name, *mode)] = run_variant(argv_variant, folder, args.steps)
                print(f"{name:10s} ac={ac:4s} compile={compile_on} colocate_autograd={colocate} backend={backend} "
                      f"{runs[(name, *mode)]}", flush=True)
    print("train_throughput: timing one attention call", file=sys.stderr, flush=True)
    times = {backend: attention_times(model_args, job.lighthouse.to_config(), args.seq_len, device, backend)
             for backend in backends}

    env = environment(device)
    records = []
    for mode in modes:
        ac, compile_on, colocate, backend = mode
        for name, dense_layers in variants[:-1]:
            lh, dense = runs[(name, *mode)], runs[("dense", *mode)]
            n_lighthouse = len([i for i in range(model_args.n_layers) if i not in dense_layers])
            model = (f"{shown_path(args.config)} ({job.model.flavor}: d {model_args.dim}, {model_args.n_layers} "
                     f"layers, {model_args.n_heads} heads; dense layers {dense_layers}; L={job.lighthouse.levels} "
                     f"p={job.lighthouse.pool} k={job.lighthouse.topk} {job.lighthouse.scorer}; "
                     f"vocabulary {args.vocab_size or model_args.vocab_size:,})")
            records.append({
                "device": env["device"], "seq_len": args.seq_len, "model": model, "dense_layers": dense_layers,
                "vocab_size": args.vocab_size or model_args.vocab_size, "activation_checkpointing": ac,
                "compile": compile_on, "colocate_autograd": colocate, "backend": backend or "config",
                "train_args": args.train_args,
                "lighthouse_tok_s": lh.get("tok_s"), "dense_tok_s": dense.get("tok_s"),
                "lighthouse_peak_gib": lh.get("peak_gib"), "dense_peak_gib": dense.get("peak_gib"),
                **amdahl(dense.get("tok_s"), lh.get("tok_s"), args.seq_len, n_lighthouse, times[backend], ac),
                "runs": {"lighthouse": lh, "dense": dense}, "attention_call_s": times[backend], "steps": args.steps,
                "environment": env,
            })

    print(f"\n{records[0]['model']}\nseq_len {args.seq_len}, batch 1, {args.steps} steps "
          f"(first {WARMUP_STEPS} not timed)")
    if on_cpu:
        print(f"CPU smoke run: tok/s is {args.steps - WARMUP_STEPS} step(s) of {args.seq_len} tokens, each variant "
              "in a fresh process whose first steps on a CPU run several times slower than its later ones; train.py's "
              f"log of the config (local batch {job.training.local_batch_size}, every step) reads higher. Compare "
              "the variants with each other, not with that log")
    print(" | ".join(f"{k} {v}" for k, v in env.items()))
    print("\n| dense layers | activation checkpointing | compile | colocated host threads | backend | "
          "Lighthouse tok/s | dense tok/s | speedup | Lighthouse peak GiB | dense peak GiB | "
          "per-layer attention speedup | Amdahl ceiling | predicted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in records:
        print(f"| {r['dense_layers']} | {r['activation_checkpointing']} | {'on' if r['compile'] else 'off'} | "
              f"{'on' if r['colocate_autograd'] else 'off'} | {r['backend']} | {fmt(r['lighthouse_tok_s'], ',.0f')} | "
              f"{fmt(r['dense_tok_s'], ',.0f')} | {fmt(r.get('speedup'), '.2f')} | "
              f"{fmt(r['lighthouse_peak_gib'], '.1f')} | {fmt(r['dense_peak_gib'], '.1f')} | "
              f"{r['lighthouse_layer_speedup']:.2f} | {fmt(r.get('amdahl_ceiling'), '.2f')} | "
              f"{fmt(r.get('predicted_speedup'), '.2f')} |")
    if args.json:
        write_json(args.json, records)
    return records


if __name__ == "__main__":
    with exit_on_config_error():
        main()
