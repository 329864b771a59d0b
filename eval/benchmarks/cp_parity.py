"""Parity and timing of the context-parallel Lighthouse layer against the single-device layer
(scripts/cp_parity.py, which says what is compared and printed), one process per rank under torchrun:
NCCL on GPUs, gloo on the CPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lighthouse import LighthouseConfig, causal_attention, lighthouse_attention, select
from lighthouse.context_parallel import (
    check_context_parallel,
    context_parallel_lighthouse_attention,
    enable_context_parallel,
    offset_selection,
    owned_chunks,
    ring_causal_attention,
    shard_selections,
)
from lighthouse.pipeline import resolve_implementation
from lighthouse.testing import error_ratio
from recipe.resilience.teardown import end_process_groups

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class CpParityJob:
    """One comparison: the layer's config, the input geometry (`dtype` a key of DTYPES), how k/v rotate, the
    device type ("cuda" or "cpu"), the timing's warm-up and timed runs, the seed, and where rank 0 writes a
    profile of the CP layer (None: no profile)."""

    config: LighthouseConfig
    seq_len: int
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    rotate_method: str
    device: str
    warmup: int
    iters: int
    seed: int
    profile: Path | None = None


def setup(device_type: str) -> tuple[torch.device, DeviceMesh]:
    """Process group (NCCL on CUDA, gloo on CPU), this rank's device and the 1-D CP mesh."""
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return device, init_device_mesh(device_type, (dist.get_world_size(),))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> float:
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


def profile_cp(fn: Callable[[], object], device: torch.device, trace: Path, rank: int, steps: int = 3) -> None:
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
    """(max abs error, max abs error / max |ref|, error ratio RMSE / RMS of ref), each the maximum over ranks."""
    worst = (test.float() - ref.float()).abs().max()
    ratio = torch.tensor(error_ratio(ref, test)[0], device=worst.device)
    out = torch.stack([worst, worst / ref.float().abs().max(), ratio])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return tuple(out.tolist())


def forward_backward(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], grad_out: torch.Tensor
                     ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(output, [grad q, grad k, grad v]) of `fn` on fresh leaves of `inputs`."""
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out.backward(grad_out)
    return out.detach(), [x.grad for x in leaves]


def selection_mismatches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, local: Sequence[torch.Tensor],
                         config: LighthouseConfig, mesh: DeviceMesh) -> int:
    """Selection entries (index or level) of every rank's chunks, by the implementation the CP layer runs
    (`shard_selections`), that differ from the single-device reference selection; summed over ranks."""
    rank, world, n = dist.get_rank(), dist.get_world_size(), q.shape[1]
    chunk = n // (2 * world)
    full_sel = select(q, k, config, v=v)
    chunk_selections = shard_selections(*local, config, mesh)
    per_chunk = config.gathered_len(n) // (2 * world)
    mismatched = torch.zeros((), dtype=torch.int64, device=q.device)
    for sel, c in zip(chunk_selections, owned_chunks(rank, world)):
        got = offset_selection(sel, c, chunk, config.pool)
        part = slice(c * per_chunk, (c + 1) * per_chunk)
        mismatched += (got.index != full_sel.index[..., part]).sum() + (got.level != full_sel.level[..., part]).sum()
    dist.all_reduce(mismatched)
    return int(mismatched)


def print_report(job: CpParityJob, device: torch.device, fused: bool, mismatched: int, table: list[tuple],
                 timings: dict[str, float], not_timed: list[str], peak_gib: float) -> None:
    """The header, the selection mismatch count, the error table, the timing table, what was not timed and why,
    and the peak memory."""
    world, n, config = dist.get_world_size(), job.seq_len, job.config
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    print(f"# CP parity: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{'NCCL' if device.type == 'cuda' else 'gloo'}, CP degree {world}, rotate {job.rotate_method}")
    print(f"# B={job.batch} N={n} H={job.heads} G={job.kv_heads} D={job.head_dim} {job.dtype}; {config}; "
          f"S={config.gathered_len(n)}")
    print(f"# per-chunk pipeline (CP and single-device layers): {'fused kernels' if fused else 'reference'}")
    print(f"selection entries differing from the single-device reference selection: {mismatched}")
    print("| tensor | max abs err | max abs err / max abs | RMSE ratio | CP vs fp32 RMSE ratio "
          "| 1-device vs fp32 RMSE ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in table:
        print(f"| {row[0]} | " + " | ".join(f"{x:.3e}" for x in row[1:]) + " |")
    print("\n| per rank | median ms | tok/s per rank |")
    print("| --- | --- | --- |")
    for label, ms in timings.items():
        tokens = job.batch * (n // world if label.startswith("CP") or "tokens per rank" in label else n)
        print(f"| {label} | {ms:.2f} | {tokens / ms * 1e3:,.0f} |")
    for reason in not_timed:
        print(f"not timed: {reason}")
    if device.type == "cuda":
        print(f"\npeak GPU memory per rank: {peak_gib:.2f} GiB")


def run_cp_parity(job: CpParityJob) -> None:
    """Compare and time the CP layer against the single-device layer on every rank; rank 0 prints the report.

    Every rank builds the same full-sequence q, k, v from the seed. The reference outputs stay alive
    through the timings, so the peak memory counts them. The caller has checked the layout against the CP
    degree (`check_context_parallel`), before any process group started."""
    device, mesh = setup(job.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    enable_context_parallel(mesh, job.rotate_method)
    dtype, config, n = DTYPES[job.dtype], job.config, job.seq_len
    # float32 truth: the efficient kernel (cuDNN and flash take 16-bit inputs only).
    truth_config = dataclasses.replace(config, backend="efficient" if device.type == "cuda" else "flash")

    gen = torch.Generator(device=device).manual_seed(job.seed)
    shape_q, shape_kv = (job.batch, n, job.heads, job.head_dim), (job.batch, n, job.kv_heads, job.head_dim)
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

    def say(step: str) -> None:  # a line per step on rank 0's stderr: a log is never silent for long
        if rank == 0:
            print(f"cp_parity: {step}", file=sys.stderr, flush=True)

    say("forward and backward: one device, CP, float32 truth")
    out_ref, grads_ref = forward_backward(single, (q, k, v), grad_out)
    out_cp, grads_cp = forward_backward(cp, local, grad_local)
    out_truth, grads_truth = forward_backward(
        lambda *x: lighthouse_attention(*x, truth_config), [x.float() for x in (q, k, v)], grad_out.float()
    )

    fused = resolve_implementation(q, config) == "fused"
    say("selection compared with the single-device reference")
    mismatched = selection_mismatches(q, k, v, local, config, mesh)

    rows = [("output", out_cp, out_ref[:, pos], out_truth[:, pos])]
    rows += [(f"grad {name}", g_cp, g_ref[:, pos], g_truth[:, pos])
             for name, g_cp, g_ref, g_truth in zip("qkv", grads_cp, grads_ref, grads_truth)]
    table = [(name, *errors(a, b), errors(a, t)[2], errors(b, t)[2]) for name, a, b, t in rows]

    timings, not_timed = {}, []

    def time_it(label: str, fn: Callable[[], object]) -> None:
        say(f"timing {label}")
        timings[label] = median_ms(fn, device, warmup=job.warmup, iters=job.iters)

    leaves = [x.detach().requires_grad_(True) for x in local]
    time_it("CP Lighthouse fwd", lambda: cp(*local))
    time_it("CP Lighthouse fwd+bwd", lambda: cp(*leaves).backward(grad_local))
    time_it("CP dense ring fwd+bwd",
            lambda: ring_causal_attention(*leaves, mesh, config.backend).backward(grad_local))
    full_leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    time_it(f"1-device Lighthouse fwd+bwd, N={n}", lambda: single(*full_leaves).backward(grad_out))
    try:
        check_context_parallel(config, n // world, 1)
        short = [x[:, : n // world].detach().requires_grad_(True) for x in (q, k, v)]
        time_it(f"1-device Lighthouse fwd+bwd, N={n // world} (tokens per rank)",
                lambda: single(*short).backward(grad_out[:, : n // world]))
    except ValueError as err:
        not_timed.append(f"1-device Lighthouse at N={n // world} (tokens per rank): {err}")
    # Where the time goes: the attention over the gathered sequence alone, ring (S/W rows per rank) and one
    # device at N/W tokens.
    def gathered_leaves(rows: int) -> list[torch.Tensor]:
        return [torch.randn(job.batch, rows, h, job.head_dim, generator=gen, device=device, dtype=dtype,
                            requires_grad=True) for h in (job.heads, job.kv_heads, job.kv_heads)]

    ring_in = gathered_leaves(config.gathered_len(n) // world)
    time_it(f"CP ring attention alone, gathered S={config.gathered_len(n)}, fwd+bwd",
            lambda: ring_causal_attention(*ring_in, mesh, config.backend).sum().backward())
    with contextlib.suppress(ValueError):  # N/W may not be a valid single-device length (reported above)
        one_in = gathered_leaves(config.gathered_len(n // world))
        time_it(f"1-device attention alone, gathered S={one_in[0].shape[1]} (tokens per rank), fwd+bwd",
                lambda: causal_attention(*one_in, config.backend).sum().backward())
    if job.profile:
        profile_cp(lambda: cp(*leaves).backward(grad_local), device, job.profile, rank)
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    peak = torch.tensor(peak_gib, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # CPU: a zero, so every rank takes part

    if rank == 0:
        print_report(job, device, fused, mismatched, table, timings, not_timed, peak.item())
    del mesh  # the last hold on the process groups outside torch's caches
    end_process_groups(finished=True)
