"""One Lighthouse layer against cuDNN SDPA on one GPU (scripts/bench_attention.py): latency, per-stage
breakdown, CUDA-graph replays, torch.compile / CUDA-graph checks.

Single layer, B=1, H=G=8, D=128, bf16, L=3, p=4, two budgets (k=2048 and k=N/64). For every N:
medians of the fused Lighthouse layer, of cuDNN SDPA on the full sequence, of FlashAttention-4 on it where it
imports (`backend = "flash_attn"`; speed-ups are then also given against the faster of the two dense kernels)
and of cuDNN SDPA alone on the gathered length S (the ceiling), forward and forward+backward. Writes the raw medians as
JSON (one object
per point), markdown tables and log-log PNG plots. Optional: replays from CUDA graphs, per-stage breakdown
with achieved GB/s against the measured HBM copy bandwidth and the host time by segment
(`eval.benchmarks.host_time`), torch.compile / CUDA-graph checks, and the
pooling and gather kernels against torch.compile / torch.gather.
"""
from __future__ import annotations

import dataclasses

import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import torch
import triton

from eval.benchmarks.gpu_parity import fwd_bwd, ratios
from eval.benchmarks.host_time import host_segments, segment_table
from lighthouse_kernels.gather import gather_pyramid
from lighthouse_kernels.pyramid import pool_and_score, stored_rows
from lighthouse_kernels.scatter import scatter_back
from lighthouse import (
    LighthouseConfig,
    causal_attention,
    norm_scores,
    pool_pyramid,
    pyramid_index,
    pyramid_scores,
    reference_lighthouse_attention,
)
from lighthouse.fused import pyramid_levels_to_store, select_gather_order, selection_of
from lighthouse.flash_attn import resolve_flash_attn
from lighthouse.fused_node import fused_lighthouse_attention
from lighthouse.gather import per_head_index
from lighthouse.host_threads import colocated_autograd

B, H, G, D, DTYPE, LEVELS, POOL = 1, 8, 8, 128, torch.bfloat16, 3, 4
DEFAULT_NS = [8192 * 2**i for i in range(7)]

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
T = TypeVar("T")


def median_ms(fn: Callable[[], object], long_threshold_ms: float = 100.0) -> float:
    """Median device time of fn() in ms: do_bench (L2 flushed between runs), or 3 timed runs if slow."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    if start.elapsed_time(end) < long_threshold_ms:
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    times = []
    for _ in range(3):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def qkv(n: int, heads: int = H, kv_heads: int = G, grad: bool = True
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh random q [B, n, heads, D], k, v [B, n, kv_heads, D] of the benchmark's dtype on the GPU."""
    return tuple(torch.randn(B, n, x, D, device="cuda", dtype=DTYPE, requires_grad=grad)
                 for x in (heads, kv_heads, kv_heads))


def fwd_and_fwd_bwd(fn: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[float, float]:
    """Median ms of fn's forward (no autograd) and of its forward+backward."""
    grad_o = torch.randn_like(q)
    with torch.no_grad():
        fwd = median_ms(lambda: fn(q, k, v))
    fwd_bwd_ms = median_ms(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), grad_o))
    return fwd, fwd_bwd_ms


def cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal cuDNN SDPA, the dense baseline and the layer's inner attention."""
    return causal_attention(q, k, v, "cudnn")


def budgets(n: int) -> list[int]:
    """The budgets timed at length n: k=2048 and k=n/64."""
    return sorted({2048, n // 64})


def valid(n: int, topk: int) -> bool:
    """Whether the benchmark's L, p with budget topk take length n."""
    try:
        LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, selection="paper").validate(n)
        return True
    except ValueError:
        return False


def bench_points(ns: list[int], device: str, selections: list[str], threads: str = "default") -> list[dict]:
    """The latency sweep: one record per (N, k, selection) of the layer, dense SDPA and SDPA on S; `threads`
    names the host threads' placement in each record."""
    points = []
    with_fa4 = resolve_flash_attn() is not None
    for n in ns:
        q, k, v = qkv(n)
        dense = fwd_and_fwd_bwd(cudnn, q, k, v)
        fa4 = fwd_and_fwd_bwd(lambda *x: causal_attention(*x, "flash_attn"), q, k, v) if with_fa4 else None
        for topk, selection in ((t, sel) for t in budgets(n) for sel in selections):
            config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend="cudnn", selection=selection)
            try:
                s = config.gathered_len(n)
            except ValueError as err:
                print(f"N={n} k={topk}: skipped ({err})", flush=True)
                continue
            lh = fwd_and_fwd_bwd(lambda *x: fused_lighthouse_attention(*x, config), q, k, v)
            ceiling = fwd_and_fwd_bwd(cudnn, *qkv(s))
            points.append(dict(device=device, threads=threads, N=n, levels=LEVELS, pool=POOL, topk=topk, S=s,
                               selection=selection, lh_fwd_ms=lh[0], lh_fwd_bwd_ms=lh[1], sdpa_fwd_ms=dense[0],
                               sdpa_fwd_bwd_ms=dense[1], sdpa_on_S_fwd_ms=ceiling[0],
                               sdpa_on_S_fwd_bwd_ms=ceiling[1],
                               **(dict(fa4_fwd_ms=fa4[0], fa4_fwd_bwd_ms=fa4[1]) if fa4 else {})))
            p = points[-1]
            print(f"N={n:>7} k={topk:>5} {selection:>6} S={s:>6}  LH {p['lh_fwd_ms']:8.3f} / "
                  f"{p['lh_fwd_bwd_ms']:8.3f} ms   "
                  f"SDPA {p['sdpa_fwd_ms']:9.2f} / {p['sdpa_fwd_bwd_ms']:9.2f} ms   SDPA(S) "
                  f"{p['sdpa_on_S_fwd_ms']:7.3f} / {p['sdpa_on_S_fwd_bwd_ms']:7.3f} ms   speed-up "
                  f"{p['sdpa_fwd_ms'] / p['lh_fwd_ms']:6.1f}x / {p['sdpa_fwd_bwd_ms'] / p['lh_fwd_bwd_ms']:6.1f}x",
                  flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return points


def hbm_copy_gbps() -> float:
    """Device-to-device copy bandwidth, bytes read + written, on 2 GiB."""
    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 2 / ms / 1e6


def stage_breakdown(n: int, topk: int) -> list[tuple[str, float, float | None]]:
    """(stage, ms, achieved GB/s or None) of each stage, forward then backward, at one point."""
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend="cudnn", selection="paper")
    stored = pyramid_levels_to_store(n, config)  # the pooled levels the layer keeps
    q, k, v = qkv(n)
    es = 2  # bytes per bf16 element
    row = D * es
    with torch.no_grad():
        pyramid = pool_and_score(q, k, v, POOL, LEVELS, stored=stored)
        packed, slots = select_gather_order(pyramid.sq, pyramid.sk, n, config)
    s = packed.shape[-1]
    np_, ntot = pyramid.q.shape[1], pyramid.sq.shape[-1]
    heads = H + 2 * G
    qt, kt, vt = gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS)
    ot = cudnn(qt, kt, vt)
    o = scatter_back(ot, slots, n, POOL, LEVELS)
    grad_o = torch.randn_like(o)
    grad_ot = torch.randn_like(ot)
    grads_t = [torch.randn_like(x) for x in (qt, kt, vt)]
    out = []

    def add(name, fn, nbytes=None):
        ms = median_ms(fn)
        out.append((name, ms, nbytes / ms / 1e6 if nbytes else None))

    with torch.no_grad():
        add("fwd pool+scores", lambda: pool_and_score(q, k, v, POOL, LEVELS, stored=stored),
            B * (n + np_) * heads * row + 2 * B * G * ntot * 4)
        add("fwd select (gather order and inverse map)", lambda: select_gather_order(pyramid.sq, pyramid.sk, n, config))
        add("fwd gather", lambda: gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS),
            2 * B * s * heads * row + B * G * s * 8)
        add("fwd SDPA on S", lambda: cudnn(qt, kt, vt))
        add("fwd scatter", lambda: scatter_back(ot, slots, n, POOL, LEVELS),
            B * (s + n) * H * row + B * G * n * LEVELS * 4)
    add("bwd scatter", lambda: torch.autograd.grad(o, ot, grad_o, retain_graph=True), B * (n + s) * H * row)
    add("bwd SDPA on S", lambda: torch.autograd.grad(ot, (qt, kt, vt), grad_ot, retain_graph=True))
    add("bwd gather+pool", lambda: torch.autograd.grad((qt, kt, vt), (q, k, v), grads_t, retain_graph=True),
        B * (s + n) * heads * row + B * G * n * LEVELS * 4)
    enqueue, wall = host_overhead_ms(
        lambda: torch.autograd.grad(fused_lighthouse_attention(q, k, v, config), (q, k, v), grad_o))
    out.append((f"layer fwd+bwd, host enqueue time per call (wall per call back to back: {wall:.3f} ms)",
                enqueue, None))
    return out


def host_breakdown(n: int, topk: int) -> list[tuple[str, float]]:
    """`eval.benchmarks.host_time.host_segments` of the layer at one point, on fresh inputs."""
    q, k, v = qkv(n)
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend="cudnn", selection="paper")
    return host_segments(q, k, v, torch.randn_like(q), config)


def stage_table(n: int, topk: int, rows: list[tuple[str, float, float | None]], bandwidth: float) -> str:
    """The per-stage breakdown as a markdown table, GB/s also as a share of the copy bandwidth."""
    table = [f"Stages at N={n:,}, k={topk:,}:", "", "| stage | ms | GB/s | % of copy bandwidth |", "|---|---|---|---|"]
    for name, ms, gbps in rows:
        share = f"{gbps:.0f} | {100 * gbps / bandwidth:.0f}%" if gbps else "- | -"
        table.append(f"| {name} | {ms:.3f} | {share} |")
    return "\n".join(table)


def agreement(eager: Sequence[torch.Tensor], other: Sequence[torch.Tensor]) -> str:
    """How a compiled or captured run's (o, dq, dk, dv) compare with eager's."""
    worst = max(ratios(eager[1:], other[1:]))
    return f"o bit-identical to eager: {torch.equal(eager[0], other[0])}, largest gradient error ratio {worst:.1e}"


def host_overhead_ms(fn: Callable[[], object], calls: int = 50) -> tuple[float, float]:
    """(host time to enqueue one call, wall time per call back to back): if they are close, the layer
    is bound by launches on the host, not by the GPU."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return (enqueued - start) * 1e3 / calls, (done - start) * 1e3 / calls


def capture(fn: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm fn up on a side stream, capture it in a CUDA graph, replay once; return (graph, outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, outputs


def graph_points(ns: list[int]) -> list[dict]:
    """The fused layer and dense cuDNN SDPA replayed from CUDA graphs, fwd and fwd+bwd (median ms): the layer's
    shapes are static and it never synchronises with the host, so a graph removes the host's launch cost,
    which bounds the eager layer at short lengths. Inputs are fresh leaves with no live autograd graph."""
    rows = []
    for n in ns:
        for topk in (t for t in budgets(n) if valid(n, t)):
            config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend="cudnn", selection="paper")
            row = dict(N=n, topk=topk, S=config.gathered_len(n))
            for name, fn in (("lh", lambda *x: fused_lighthouse_attention(*x, config)), ("sdpa", cudnn)):
                q, k, v = qkv(n)
                grad_o = torch.randn_like(q)

                def forward():
                    with torch.no_grad():
                        return fn(q, k, v)

                def forward_backward():
                    return torch.autograd.grad(fn(q, k, v), (q, k, v), grad_o)

                for key, step in (("fwd", forward), ("fwd_bwd", forward_backward)):
                    graph, _ = capture(step)
                    row[f"{name}_{key}_graph_ms"] = median_ms(graph.replay)
            rows.append(row)
            print(f"N={n:>7} k={topk:>5} CUDA graphs: LH {row['lh_fwd_graph_ms']:.3f} / "
                  f"{row['lh_fwd_bwd_graph_ms']:.3f} ms, "
                  f"SDPA {row['sdpa_fwd_graph_ms']:.3f} / {row['sdpa_fwd_bwd_graph_ms']:.3f} ms", flush=True)
    return rows


def graph_table(rows: list[dict], points: list[dict]) -> str:
    """Graph replays against dense cuDNN SDPA, eager (from the latency sweep, where it ran) and replayed."""
    eager = {(p["N"], p["topk"]): p for p in points}
    lines = ["| N | k | S | LH fwd ms (graph) | fwd vs SDPA eager / graph | LH fwd+bwd ms (graph) | "
             "fwd+bwd vs SDPA eager / graph |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        e = eager.get((r["N"], r["topk"]), {})
        fwd_eager = speedup(e["sdpa_fwd_ms"] / r["lh_fwd_graph_ms"]) if e else "-"
        bwd_eager = speedup(e["sdpa_fwd_bwd_ms"] / r["lh_fwd_bwd_graph_ms"]) if e else "-"
        lines.append(f"| {r['N']:,} | {r['topk']:,} | {r['S']:,} | {r['lh_fwd_graph_ms']:.3f} | {fwd_eager} / "
                     f"{speedup(r['sdpa_fwd_graph_ms'] / r['lh_fwd_graph_ms'])} | {r['lh_fwd_bwd_graph_ms']:.3f} | "
                     f"{bwd_eager} / {speedup(r['sdpa_fwd_bwd_graph_ms'] / r['lh_fwd_bwd_graph_ms'])} |")
    return "\n".join(lines)


def graph_capture_report(n: int, config: LighthouseConfig, layer: Attention) -> list[str]:
    """Capture each stage alone in a CUDA graph (to find any that cannot be captured), plain cuDNN SDPA and
    the reference layer for comparison, then the fused layer's forward+backward. All inputs are drawn
    first (a failed capture leaves the random generator unusable), and the leaves that are captured have
    no autograd graph alive from an eager run on the default stream (which breaks capture)."""
    q, k, v = qkv(n, grad=False)
    leaves = qkv(n)
    grad_o = torch.randn_like(leaves[0])

    def step(fn):
        return fwd_bwd(fn, *leaves, grad_o)

    eager = tuple(x.detach() for x in step(layer))
    stored = pyramid_levels_to_store(n, config)
    pyramid = pool_and_score(q, k, v, POOL, LEVELS, stored=stored)
    packed, slots = select_gather_order(pyramid.sq, pyramid.sk, n, config)
    qt, kt, vt = gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS)
    qg, kg, vg = (x.detach().requires_grad_() for x in (qt, kt, vt))
    grad_t = torch.randn_like(qt)
    others = {b: dataclasses.replace(config, backend=b) for b in ("flash", "efficient")}
    forward_only = {
        "pool+scores": lambda: pool_and_score(q, k, v, POOL, LEVELS, stored=stored),
        "select": lambda: select_gather_order(pyramid.sq, pyramid.sk, n, config),
        "gather": lambda: gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS),
        "scatter": lambda: scatter_back(qt, slots, n, POOL, LEVELS),
        "cuDNN SDPA fwd": lambda: cudnn(qt, kt, vt),
        "fused layer fwd": lambda: fused_lighthouse_attention(q, k, v, config),
    }
    with_backward = {
        "cuDNN SDPA fwd+bwd": lambda: torch.autograd.grad(cudnn(qg, kg, vg), (qg, kg, vg), grad_t),
        "reference layer fwd+bwd": lambda: step(lambda *x: reference_lighthouse_attention(*x, config)),
        "fused layer fwd+bwd, backend=flash": lambda: step(lambda *x: fused_lighthouse_attention(*x, others["flash"])),
        "fused layer fwd+bwd, backend=efficient":
            lambda: step(lambda *x: fused_lighthouse_attention(*x, others["efficient"])),
    }

    def attempt(name, fn, grad):
        try:
            with torch.set_grad_enabled(grad):
                capture(fn)
            return f"capture of {name}: ok"
        except Exception as err:
            return f"capture of {name}: {type(err).__name__}: {str(err).splitlines()[0][:160]}"

    notes = [attempt(name, fn, False) for name, fn in forward_only.items()]
    try:  # the layer itself first, before any other capture touches the leaves
        graph, captured = capture(lambda: step(layer))
        notes.append(f"CUDA graph of the fused layer fwd+bwd (cuDNN): replays in {median_ms(graph.replay):.3f} ms "
                     f"(eager {median_ms(lambda: step(layer)):.3f} ms); {agreement(eager, captured)}")
    except Exception as err:
        notes.append(f"CUDA graph of the fused layer fwd+bwd (cuDNN): {type(err).__name__}: "
                     f"{str(err).splitlines()[0][:200]}")
    notes += [attempt(name, fn, True) for name, fn in with_backward.items()]
    return notes


def check_compile_and_graphs(n: int) -> list[str]:
    """Run the layer (fwd+bwd) under torch.compile(fullgraph=True) and in a captured CUDA graph."""
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=max(128, n // 64), backend="cudnn", selection="paper")
    q, k, v = qkv(n)
    grad_o = torch.randn_like(q)

    def step(fn):
        return fwd_bwd(fn, q, k, v, grad_o)

    def layer(q_, k_, v_):
        return fused_lighthouse_attention(q_, k_, v_, config)

    eager = tuple(x.detach() for x in step(layer))
    notes = []
    for fullgraph in (True, False):
        try:
            compiled = torch.compile(layer, fullgraph=fullgraph)
            ms = median_ms(lambda: step(compiled))
            notes.append(f"torch.compile(fullgraph={fullgraph}): runs, fwd+bwd {ms:.3f} ms "
                         f"(eager {median_ms(lambda: step(layer)):.3f} ms); {agreement(eager, step(compiled))}")
            break
        except Exception as err:
            notes.append(f"torch.compile(fullgraph={fullgraph}): {type(err).__name__}: {str(err)[:400]}")
    notes += graph_capture_report(n, config, layer)
    return [f"N={n}: {x}" for x in notes]


def extras(n: int, topk: int) -> list[str]:
    """The fused pooling pass vs torch.compile of the reference, and the gather kernel vs torch.gather."""
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend="cudnn", selection="paper")
    stored = pyramid_levels_to_store(n, config)
    q, k, v = qkv(n, grad=False)
    notes = []

    def reference_pool_scores(q_, k_, v_):
        pooled = [torch.cat(pool_pyramid(x, POOL, LEVELS)[1:], dim=1) for x in (q_, k_, v_)]
        sq, sk = norm_scores(q_, k_)
        return pooled, [torch.cat(pyramid_scores(s, POOL, LEVELS), dim=-1) for s in (sq, sk)]

    triton_ms = median_ms(lambda: pool_and_score(q, k, v, POOL, LEVELS, stored=stored))
    pool_bytes = B * (n + stored_rows(n, POOL, LEVELS, stored)) * (H + 2 * G) * D * 2
    for tokens in (32, 64, 128, 256):
        for warps in (4, 8):
            ms = median_ms(lambda: pool_and_score(q, k, v, POOL, LEVELS, stored=stored, tokens_per_program=tokens,
                                                    num_warps=warps))
            notes.append(f"N={n} pool+scores variant tokens/program={tokens} warps={warps}: {ms:.3f} ms, "
                         f"{pool_bytes / ms / 1e6:.0f} GB/s")
    try:
        compiled = torch.compile(reference_pool_scores)
        compiled_ms = median_ms(lambda: compiled(q, k, v))
        notes.append(f"N={n} pool+scores: Triton {triton_ms:.3f} ms, torch.compile of the reference "
                     f"{compiled_ms:.3f} ms")
    except Exception as err:
        notes.append(f"N={n} pool+scores: Triton {triton_ms:.3f} ms, torch.compile failed: {type(err).__name__}: {err}")
    pyramid = pool_and_score(q, k, v, POOL, LEVELS)  # every level: torch.gather needs the whole pyramid
    packed, slots = select_gather_order(pyramid.sq, pyramid.sk, n, config)
    flat = pyramid_index(selection_of(packed, config), n, POOL, LEVELS)
    concatenated = [torch.cat([x, p], dim=1) for x, p in zip((q, k, v), pyramid[:3])]
    idx = [per_head_index(flat, x.shape[2], D) for x in concatenated]
    torch_ms = median_ms(lambda: [torch.gather(x, 1, i) for x, i in zip(concatenated, idx)])
    fused_ms = median_ms(lambda: gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS))
    notes.append(f"N={n} k={topk} gather of Q~,K~,V~: Triton {fused_ms:.3f} ms, torch.gather on the concatenated "
                 f"pyramid {torch_ms:.3f} ms (index precomputed, concatenation not timed)")
    return notes


def speedup(ratio: float) -> str:
    """A speed-up as the tables print it: two decimals below 10x, where targets such as 1.5x sit."""
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def fastest_dense_ms(point: dict, key: str) -> float:
    """The faster dense kernel's median for `key` ("fwd" or "fwd_bwd"): cuDNN's, or FlashAttention-4's where timed."""
    return min(point[f"{name}_{key}_ms"] for name in ("sdpa", "fa4") if f"{name}_{key}_ms" in point)


def tables(points: list[dict]) -> str:
    """The latency sweep as a markdown table, one row per point; with FlashAttention-4 timed, its dense column
    and the speed-ups against the faster dense kernel too."""
    fa4 = all("fa4_fwd_ms" in p for p in points)
    dense = ["SDPA {0} ms"] + (["FA4 {0} ms"] if fa4 else [])
    speedups = ["{0} speed-up"] + (["{0} speed-up vs fastest dense"] if fa4 else [])
    head = ["N", "k", "selection", "S"] + [c.format(part) for part in ("fwd", "fwd+bwd") for c in
                                           ["LH {0} ms", *dense, *speedups, "SDPA(S) {0} ms"]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        cells = [f"{p['N']:,}", f"{p['topk']:,}", p.get("selection", "paper"), f"{p['S']:,}"]
        for key in ("fwd", "fwd_bwd"):
            lh = p[f"lh_{key}_ms"]
            cells += [f"{lh:.3f}", f"{p[f'sdpa_{key}_ms']:.2f}", *([f"{p[f'fa4_{key}_ms']:.2f}"] if fa4 else []),
                      speedup(p[f"sdpa_{key}_ms"] / lh), *([speedup(fastest_dense_ms(p, key) / lh)] if fa4 else []),
                      f"{p[f'sdpa_on_S_{key}_ms']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(points: list[dict], directory: Path) -> None:
    """Latency against N, the paper selection's points (the causal mode's are in the tables)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in points if p.get("selection", "paper") == "paper"]
    for key, title in (("fwd", "forward"), ("fwd_bwd", "forward + backward")):
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        dense = sorted({(p["N"], p[f"sdpa_{key}_ms"]) for p in points})
        ax.plot(*zip(*dense), "k-o", label="cuDNN SDPA, full N")
        for name, pick in (("k=2048", lambda p: p["topk"] == 2048), ("k=N/64", lambda p: p["topk"] == p["N"] // 64)):
            sel = [p for p in points if pick(p)]
            if sel:
                ax.plot([p["N"] for p in sel], [p[f"lh_{key}_ms"] for p in sel], "-o", label=f"Lighthouse, {name}")
                ax.plot([p["N"] for p in sel], [p[f"sdpa_on_S_{key}_ms"] for p in sel], ":x",
                        label=f"cuDNN SDPA on S alone, {name}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("median latency (ms)")
        threads = points[0].get("threads", "default")
        ax.set_title(f"{points[0]['device']}: one layer, {title} (B=1, H=8, D=128, bf16, L=3, p=4)\n"
                     f"host threads: {threads}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(directory / f"bench_attention_{key}.png", dpi=130)
        plt.close(fig)


def run_once(n: int) -> None:
    """One forward+backward of the layer at length n, k=2048 (to profile a single call, e.g. under ncu);
    ValueError if that budget does not fit n (the fused call itself does not check lengths)."""
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=2048, backend="cudnn", selection="paper")
    config.validate(n)
    q, k, v = qkv(n)
    torch.autograd.grad(fused_lighthouse_attention(q, k, v, config), (q, k, v), torch.randn_like(q))
    torch.cuda.synchronize()


def run_benchmark(ns: list[int], selections: list[str], graph_ns: list[int], stage_ns: list[int], check_n: int,
                  with_extras: bool, out: Path, colocate: bool = False) -> None:
    """Run the parts asked for, printing each as it ends, and write into `out`: bench_attention.json and the
    plots (latency sweep over `ns`), bench_attention_graphs.json (replays at `graph_ns`) and bench_tables.md
    (every table and note, after a line naming the device, versions, copy bandwidth and command).
    `colocate`: every part runs with this thread and autograd's device threads on one CPU."""
    with colocated_autograd() if colocate else nullcontext():
        _run_benchmark(ns, selections, graph_ns, stage_ns, check_n, with_extras, out,
                       "colocated on one CPU" if colocate else "default")


def _run_benchmark(ns: list[int], selections: list[str], graph_ns: list[int], stage_ns: list[int], check_n: int,
                   with_extras: bool, out: Path, threads: str) -> None:
    device = torch.cuda.get_device_properties(0).name
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {device}: torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
          f"triton {triton.__version__}; host threads: {threads}", flush=True)
    bandwidth = hbm_copy_gbps()
    print(f"HBM copy bandwidth (read+write): {bandwidth:.0f} GB/s", flush=True)
    sections = [f"Device: {device}; torch {torch.__version__}; CUDA {torch.version.cuda}; cuDNN "
                f"{torch.backends.cudnn.version()}; Triton {triton.__version__}; measured copy bandwidth "
                f"{bandwidth:.0f} GB/s; host threads (caller and autograd's): {threads}; command: python "
                f"{' '.join(sys.argv)}"]

    t0 = time.perf_counter()
    points = bench_points(ns, device, selections, threads)
    if points:
        (out / "bench_attention.json").write_text(json.dumps(points, indent=1) + "\n")
        sections.append(tables(points))
        plot(points, out)
    print(f"[latency sweep {time.perf_counter() - t0:.0f}s]", flush=True)
    graphs = graph_points(graph_ns)
    if graphs:
        (out / "bench_attention_graphs.json").write_text(json.dumps(graphs, indent=1) + "\n")
        sections.append("CUDA graphs (replay medians):\n\n" + graph_table(graphs, points))
        print(sections[-1], flush=True)
    for n in stage_ns:
        for topk in (t for t in budgets(n) if valid(n, t)):
            sections.append(stage_table(n, topk, stage_breakdown(n, topk), bandwidth))
            sections.append(segment_table(n, topk, host_breakdown(n, topk)))
            print("\n\n".join(sections[-2:]), flush=True)
    for wanted, notes_of in ((with_extras, lambda: extras(524288, 2048)),
                             (check_n, lambda: check_compile_and_graphs(check_n))):
        if not wanted:
            continue
        try:
            notes = notes_of()
        except Exception as err:  # keep what was measured so far
            notes = [f"{type(err).__name__}: {str(err)[:300]}"]
        sections.append("\n".join(f"- {x}" for x in notes))
        print(sections[-1], flush=True)
    (out / "bench_tables.md").write_text("\n\n".join(sections) + "\n")
    print("\n" + sections[1] if points else "", flush=True)
