"""The output layer plus cross-entropy at a Llama-3 vocabulary, per implementation, on one GPU: memory, time, and
error against the full loss in float32 (what decides `[loss] implementation`; eval/benchmarks/output_loss.py).

    python scripts/bench_output_loss.py --json outputs/output_loss.json   # 98,304 tokens, d 1024, 128,256 entries
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from eval.benchmarks.output_loss import implementations, inputs, measure, reference
from eval.device import require_cuda
from eval.options import int_list
from eval.records import environment, write_json


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=98_304, help="tokens (one rank's microbatch)")
    parser.add_argument("--dim", type=int, default=1024, help="hidden size (the paper model's)")
    parser.add_argument("--vocab", type=int, default=128_256, help="vocabulary (Llama-3's)")
    parser.add_argument("--chunks", type=int_list, default=[2048, 4096, 8192],
                        help="chunk sizes of the recipe's chunked loss, comma-separated")
    parser.add_argument("--reps", type=int, default=3, help="timed forward + backward calls after one warm-up")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    require_cuda()
    device = torch.device("cuda")
    hidden, weight, labels = inputs(args.tokens, args.dim, args.vocab, device)
    print("bench_output_loss: float32 reference", file=sys.stderr, flush=True)
    ref = reference(hidden, weight, labels)
    impls = {}
    for chunk in args.chunks:
        for name, impl in implementations(chunk).items():
            impls.setdefault(name if name != "chunked" else f"chunked_{chunk}", impl)
    records = []
    for name, impl in impls.items():
        print(f"bench_output_loss: {name}", file=sys.stderr, flush=True)
        result = measure(impl, hidden, weight, labels, ref, args.reps)
        records.append({"implementation": name, "tokens": args.tokens, "dim": args.dim, "vocab": args.vocab,
                        "dtype": "bfloat16", **result, "reference_loss": ref[0], "environment": environment(device)})
        torch.cuda.empty_cache()
    print(" | ".join(f"{k} {v}" for k, v in records[0]["environment"].items()))
    print(f"\n{args.tokens:,} tokens, d {args.dim}, vocabulary {args.vocab:,}, bf16 inputs, fwd+bwd of the mean loss\n")
    print("| implementation | ms | peak GiB above inputs | loss rel. error | grad hidden error ratio | "
          "grad weight error ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in records:
        if "error" in r:
            print(f"| {r['implementation']} | {r['error']} | | | | |")
        else:
            print(f"| {r['implementation']} | {r['ms']:.1f} | {r['peak_gib']:.2f} | {r['loss_rel_error']:.2e} | "
                  f"{r['grad_hidden_error_ratio']:.2e} | {r['grad_weight_error_ratio']:.2e} |")
    if args.json:
        write_json(args.json, records)
    return records


if __name__ == "__main__":
    main()
