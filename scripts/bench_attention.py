"""Benchmark one Lighthouse layer against cuDNN SDPA: latency, per-stage breakdown, compile/graph checks.

What it measures and writes: eval/benchmarks/attention_bench.py.

Usage: python scripts/bench_attention.py [--ns 8192,65536] [--selection paper,causal,strict] [--stages 524288]
       [--graphs 8192,32768] [--checks 8192] [--extras] [--out docs/records]  (default: outputs/bench_attention)
       [--once 524288]  (one fwd+bwd, e.g. under ncu)  [--colocate-autograd]  (lighthouse.host_threads)
"""
from __future__ import annotations

import argparse

from eval.device import require_cuda
from eval.options import int_list, output_folder, positive_int_list, selection_list


def main() -> None:
    """Parse the options and run the benchmark (or the one call of --once)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default=None, type=positive_int_list,
                        help="comma-separated sequence lengths (default: 8192 to 524288, doubling)")
    parser.add_argument("--stages", default="524288", type=int_list,
                        help="N values for the per-stage breakdown ('' for none)")
    parser.add_argument("--graphs", default="", type=int_list,
                        help="comma-separated N to time replayed from CUDA graphs")
    parser.add_argument("--checks", type=int, default=0, help="N for the torch.compile / CUDA-graph check (0: skip)")
    parser.add_argument("--extras", action="store_true", help="pooling vs torch.compile, gather vs torch.gather")
    parser.add_argument("--selection", default=["paper"], type=selection_list,
                        help="comma-separated selection modes to time (paper,causal,strict)")
    parser.add_argument("--out", default="outputs/bench_attention", type=output_folder,
                        help="folder for bench_attention.json, tables and plots (docs/records/ to publish)")
    parser.add_argument("--once", type=int, default=0, help="only run one fwd+bwd at this N, k=2048 (for ncu)")
    parser.add_argument("--colocate-autograd", action="store_true",
                        help="run with this thread and autograd's device threads on one CPU (lighthouse.host_threads)")
    args = parser.parse_args()
    require_cuda()
    # imports Triton: after the CUDA check
    from eval.benchmarks.attention_bench import DEFAULT_NS, run_benchmark, run_once

    if args.once:
        run_once(args.once)
        return
    run_benchmark(DEFAULT_NS if args.ns is None else args.ns, args.selection, args.graphs, args.stages, args.checks,
                  args.extras, args.out, args.colocate_autograd)


if __name__ == "__main__":
    main()
