"""Parity and timing of the context-parallel Lighthouse layer against the single-device layer.

    torchrun --nproc_per_node=2 --local-ranks-filter 0 scripts/cp_parity.py      # NCCL, N = 131072, bf16
    torchrun --nproc_per_node=4 --local-ranks-filter 0 scripts/cp_parity.py --seq-len 262144
    torchrun --nproc_per_node=2 --local-ranks-filter 0 scripts/cp_parity.py --device cpu --seq-len 4096 \\
        --head-dim 32 --topk 256 --tile-budget 32 --dtype float32        # gloo smoke run

Every rank builds the same full-sequence q, k, v (one seed), runs the single-device `lighthouse_attention`
on the whole sequence, runs `context_parallel_lighthouse_attention` on its head/tail shards and compares its
rows, forward and backward (errors are the maximum over ranks). Both are also compared with a float32
single-device run, so the CP error can be read against the layer's own rounding error. Both layers take
the fused kernels where `lighthouse.pipeline.resolve_implementation` says so (the output names the path), and
the per-chunk selection of that path is compared with the single-device reference selection (fused scores
differ by float32 summation order, so a near-tie may count there). Timings are per rank, the slowest
rank's median over `--iters` runs.
"""
from __future__ import annotations

import argparse
import os

from eval.benchmarks.cp_parity import DTYPES, CpParityJob, run_cp_parity
from eval.device import require_cuda
from eval.options import file_to_write, non_negative_int, positive_int, torch_seed
from lighthouse import LighthouseConfig
from lighthouse.config import SELECTIONS
from lighthouse.context_parallel import check_context_parallel
from recipe.train.cli import ConfigError, as_config_error, exit_on_config_error


def parse_args() -> argparse.Namespace:
    """The layer's settings, the input geometry, the CP options and the timing; usage errors (exit code 2) for a
    geometry that cannot be built or no timed run."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=positive_int, default=131072)
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--kv-heads", type=positive_int, default=8)
    p.add_argument("--head-dim", type=positive_int, default=128)
    p.add_argument("--levels", type=int, default=3)
    p.add_argument("--pool", type=int, default=4)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--tile-budget", type=int, default=128)
    p.add_argument("--scorer", default="norm", choices=("norm", "dilated"))
    p.add_argument("--selection", default=LighthouseConfig.selection, choices=SELECTIONS,
                   help="how entries are scored for selection (default: the layer's)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    p.add_argument("--rotate-method", default="allgather", choices=("allgather", "alltoall"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--warmup", type=non_negative_int, default=3)
    p.add_argument("--iters", type=positive_int, default=10)
    p.add_argument("--seed", type=torch_seed, default=0)
    p.add_argument("--profile", type=file_to_write, help="also profile CP fwd+bwd: rank 0 writes a Chrome trace here "
                   "and prints the top operators")
    args = p.parse_args()
    if args.heads % args.kv_heads:
        p.error(f"--heads={args.heads} is not a multiple of --kv-heads={args.kv_heads} (each kv head serves as many "
                "query heads)")
    return args


def main() -> None:
    """Parse the options and run the comparison on this rank."""
    args = parse_args()
    if args.device == "cuda":
        require_cuda("--device cpu runs it with gloo")
    with exit_on_config_error(), as_config_error():  # one line on each rank, exit 2, before any group starts
        config = LighthouseConfig(
            levels=args.levels, pool=args.pool, topk=args.topk, tile_budget=args.tile_budget, scorer=args.scorer,
            selection=args.selection, backend=args.backend,
        )
        check_context_parallel(config, args.seq_len, int(os.environ.get("WORLD_SIZE", "1")))
        if "RANK" not in os.environ:  # else the process group's traceback: "environment variable RANK expected"
            raise ConfigError("cp_parity.py compares the layer split over ranks with one device's: start it with "
                              "torchrun, e.g. torchrun --nproc_per_node=2 scripts/cp_parity.py --device cpu")
    run_cp_parity(CpParityJob(
        config=config, seq_len=args.seq_len, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads,
        head_dim=args.head_dim, dtype=args.dtype, rotate_method=args.rotate_method, device=args.device,
        warmup=args.warmup, iters=args.iters, seed=args.seed, profile=args.profile,
    ))


if __name__ == "__main__":
    main()
