"""Parity and timing of the context-parallel Lighthouse layer against the single-device layer.

    torchrun --nproc_per_node=2 scripts/cp_parity.py                      # NCCL, N = 131072, bf16
    torchrun --nproc_per_node=4 scripts/cp_parity.py --seq-len 262144
    torchrun --nproc_per_node=2 scripts/cp_parity.py --device cpu --seq-len 4096 --head-dim 32 \\
        --topk 256 --tile-budget 32 --dtype float32                        # gloo smoke run

Every rank builds the same full-sequence q, k, v (one seed), runs the single-device `lighthouse_attention`
on the whole sequence, runs `context_parallel_lighthouse_attention` on its head/tail shards and compares its
rows, forward and backward (errors are the maximum over ranks). Both are also compared with a float32
single-device run, so the CP error can be read against the layer's own rounding error. Both layers take
the fused kernels where `lighthouse.layer.uses_fused_kernels` says so (the output names the path), and
the per-chunk selection of that path is compared with the single-device reference selection (fused scores
differ by float32 summation order, so a near-tie may count there). Timings are per rank, the slowest
rank's median over `--iters` runs.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lighthouse import LighthouseConfig, causal_attention, lighthouse_attention, select  # noqa: E402
from lighthouse.context_parallel import (  # noqa: E402
    check_context_parallel,
    context_parallel_lighthouse_attention,
    fused_shard_selections,
    offset_selection,
    owned_chunks,
    ring_causal_attention,
    shard_selections,
)
from lighthouse.layer import uses_fused_kernels  # noqa: E402
from recipe.context_parallel import enable_context_parallel  # noqa: E402
from require_cuda import require_cuda  # noqa: E402  (scripts/, the script's own folder)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=131072)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--levels", type=int, default=3)
    p.add_argument("--pool", type=int, default=4)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--tile-budget", type=int, default=128)
    p.add_argument("--scorer", default="norm", choices=("norm", "dilated"))
    p.add_argument("--backend", default="auto")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    p.add_argument("--rotate-method", default="allgather", choices=("allgather", "alltoall"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=Path, help="also profile CP fwd+bwd: rank 0 writes a Chrome trace here and "
                   "prints the top operators")
    return p.parse_args()


def setup(device_type: str):
    """Process group (NCCL on CUDA, gloo on CPU), this rank's device and the 1-D CP mesh."""
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return device, init_device_mesh(device_type, (dist.get_world_size(),))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, device: torch.device, warmup: int, iters: int) -> float:
    """Median wall time of `fn` in ms, ranks started together; the slowest rank's median."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    slowest = torch.tensor(statistics.median(times), dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()


def profile_cp(fn, device: torch.device, trace: Path, rank: int, steps: int = 3) -> None:
    """Profile `steps` calls of `fn` on every rank; rank 0 writes a Chrome trace and prints the top operators."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        synchronize(device)
    if rank == 0:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(f"\n# profile of {steps} CP fwd+bwd calls, rank 0 (trace: {trace})")
        print(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=70))


def errors(test: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    """(max abs error, max abs error / max |ref|, RMSE / RMS of ref), each the maximum over ranks."""
    diff = (test.float() - ref.float())
    ref = ref.float()
    rms = lambda x: x.pow(2).mean().sqrt()  # noqa: E731
    out = torch.stack([diff.abs().max(), diff.abs().max() / ref.abs().max(), rms(diff) / rms(ref)])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return tuple(out.tolist())


def forward_backward(fn, inputs, grad_out):
    """(output, [grad q, grad k, grad v]) of `fn` on fresh leaves of `inputs`."""
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out.backward(grad_out)
    return out.detach(), [x.grad for x in leaves]


def main() -> None:
    args = parse_args()
    if args.device == "cuda":
        require_cuda("--device cpu runs it with gloo")
    device, mesh = setup(args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    enable_context_parallel(mesh, args.rotate_method)
    dtype = DTYPES[args.dtype]
    config = LighthouseConfig(
        levels=args.levels, pool=args.pool, topk=args.topk, tile_budget=args.tile_budget, scorer=args.scorer,
        backend=args.backend,
    )
    n = args.seq_len
    check_context_parallel(config, n, world)
    # float32 truth: the efficient kernel (cuDNN and flash take 16-bit inputs only).
    truth_config = dataclasses.replace(config, backend="efficient" if device.type == "cuda" else "flash")

    gen = torch.Generator(device=device).manual_seed(args.seed)
    shape_q, shape_kv = (args.batch, n, args.heads, args.head_dim), (args.batch, n, args.kv_heads, args.head_dim)
    q, k, v = (torch.randn(s, generator=gen, device=device, dtype=dtype) for s in (shape_q, shape_kv, shape_kv))
    grad_out = torch.randn(shape_q, generator=gen, device=device, dtype=dtype)
    chunk = n // (2 * world)
    pos = torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device) for c in owned_chunks(rank, world)])
    local = [x[:, pos].contiguous() for x in (q, k, v)]
    grad_local = grad_out[:, pos].contiguous()

    def single(*x):
        return lighthouse_attention(*x, config)

    def cp(*x):
        return context_parallel_lighthouse_attention(*x, config, mesh)

    out_ref, grads_ref = forward_backward(single, (q, k, v), grad_out)
    out_cp, grads_cp = forward_backward(cp, local, grad_local)
    out_truth, grads_truth = forward_backward(
        lambda *x: lighthouse_attention(*x, truth_config), [x.float() for x in (q, k, v)], grad_out.float()
    )

    fused = uses_fused_kernels(q, config)
    full_sel = select(q, k, config, v=v)
    chunk_selections = (fused_shard_selections if fused else shard_selections)(*local, config, mesh)
    per_chunk = config.gathered_len(n) // (2 * world)
    mismatched = torch.zeros((), dtype=torch.int64, device=device)
    for sel, c in zip(chunk_selections, owned_chunks(rank, world)):
        got = offset_selection(sel, c, chunk, config.pool)
        part = slice(c * per_chunk, (c + 1) * per_chunk)
        mismatched += (got.index != full_sel.index[..., part]).sum() + (got.level != full_sel.level[..., part]).sum()
    dist.all_reduce(mismatched)

    rows = [("output", out_cp, out_ref[:, pos], out_truth[:, pos])]
    rows += [(f"grad {name}", g_cp, g_ref[:, pos], g_truth[:, pos])
             for name, g_cp, g_ref, g_truth in zip("qkv", grads_cp, grads_ref, grads_truth)]
    table = [(name, *errors(a, b), errors(a, t)[2], errors(b, t)[2]) for name, a, b, t in rows]

    timings = {}
    fb = dict(warmup=args.warmup, iters=args.iters)
    leaves = [x.detach().requires_grad_(True) for x in local]
    timings["CP Lighthouse fwd"] = median_ms(lambda: cp(*local), device, **fb)
    timings["CP Lighthouse fwd+bwd"] = median_ms(lambda: cp(*leaves).backward(grad_local), device, **fb)
    timings["CP dense ring fwd+bwd"] = median_ms(
        lambda: ring_causal_attention(*leaves, mesh, config.backend).backward(grad_local), device, **fb
    )
    full_leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    timings[f"1-device Lighthouse fwd+bwd, N={n}"] = median_ms(
        lambda: single(*full_leaves).backward(grad_out), device, **fb
    )
    try:
        check_context_parallel(config, n // world, 1)
        short = [x[:, : n // world].detach().requires_grad_(True) for x in (q, k, v)]
        timings[f"1-device Lighthouse fwd+bwd, N={n // world} (tokens per rank)"] = median_ms(
            lambda: single(*short).backward(grad_out[:, : n // world]), device, **fb
        )
    except ValueError as err:
        timings[f"1-device Lighthouse at N={n // world}: {err}"] = float("nan")
    # Where the time goes: the attention over the gathered sequence alone, ring (S/W rows per rank) and one
    # device at N/W tokens.
    def gathered_leaves(rows: int) -> list[torch.Tensor]:
        return [torch.randn(args.batch, rows, h, args.head_dim, generator=gen, device=device, dtype=dtype,
                            requires_grad=True) for h in (args.heads, args.kv_heads, args.kv_heads)]

    ring_in = gathered_leaves(config.gathered_len(n) // world)
    timings[f"CP ring attention alone, gathered S={config.gathered_len(n)}, fwd+bwd"] = median_ms(
        lambda: ring_causal_attention(*ring_in, mesh, config.backend).sum().backward(), device, **fb
    )
    with contextlib.suppress(ValueError):  # N/W may not be a valid single-device length (reported above)
        one_in = gathered_leaves(config.gathered_len(n // world))
        timings[f"1-device attention alone, gathered S={one_in[0].shape[1]} (tokens per rank), fwd+bwd"] = median_ms(
            lambda: causal_attention(*one_in, config.backend).sum().backward(), device, **fb
        )
    if args.profile:
        profile_cp(lambda: cp(*leaves).backward(grad_local), device, args.profile, rank)
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    peak = torch.tensor(peak_gib, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # CPU: a zero, so every rank takes part

    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
        print(f"# CP parity: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"{'NCCL' if device.type == 'cuda' else 'gloo'}, CP degree {world}, rotate {args.rotate_method}")
        print(f"# B={args.batch} N={n} H={args.heads} G={args.kv_heads} D={args.head_dim} {args.dtype}; {config}; "
              f"S={config.gathered_len(n)}")
        print(f"# per-chunk pipeline (CP and single-device layers): {'fused kernels' if fused else 'reference'}")
        print(f"selection entries differing from the single-device reference selection: {int(mismatched)}")
        print("| tensor | max abs err | max abs err / max abs | RMSE ratio | CP vs fp32 RMSE ratio "
              "| 1-device vs fp32 RMSE ratio |")
        print("| --- | --- | --- | --- | --- | --- |")
        for row in table:
            print(f"| {row[0]} | " + " | ".join(f"{x:.3e}" for x in row[1:]) + " |")
        print("\n| per rank | median ms | tok/s per rank |")
        print("| --- | --- | --- |")
        for label, ms in timings.items():
            tokens = args.batch * (n // world if label.startswith("CP") or "tokens per rank" in label else n)
            print(f"| {label} | {ms:.2f} | {tokens / ms * 1e3:,.0f} |")
        if device.type == "cuda":
            print(f"\npeak GPU memory per rank: {peak.item():.2f} GiB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
