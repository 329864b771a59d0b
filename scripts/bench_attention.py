"""Benchmark one Lighthouse layer against cuDNN SDPA: latency, per-stage breakdown, compile/graph checks.

Single layer, B=1, H=G=8, D=128, bf16, L=3, p=4, two budgets (k=2048 and k=N/64). For every N:
medians of the fused Lighthouse layer, of cuDNN SDPA on the full sequence and of cuDNN SDPA alone on the
gathered length S (the ceiling), forward and forward+backward. Writes the raw medians as JSON (one object
per point), markdown tables and log-log PNG plots. Optional: per-stage breakdown with achieved GB/s
against the measured HBM copy bandwidth, torch.compile / CUDA-graph checks, and the pooling and gather
kernels against torch.compile / torch.gather.

Usage: python scripts/bench_attention.py [--ns 8192,65536] [--selection paper,causal] [--stages 524288]
       [--checks 8192] [--extras] [--out docs]  (default out: outputs/bench_attention)
       [--once 524288]  (one fwd+bwd, e.g. under ncu)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels._testing import error_ratio  # noqa: E402
from kernels.fused import fused_lighthouse_attention  # noqa: E402
from kernels.gather import gather_pyramid  # noqa: E402
from kernels.ordering import slot_map  # noqa: E402
from kernels.pyramid import pool_and_score  # noqa: E402
from kernels.scatter import scatter_back  # noqa: E402
from kernels.selection import select_packed, selection_of  # noqa: E402
from lighthouse import (  # noqa: E402
    LighthouseConfig,
    reference_lighthouse_attention,
    causal_attention,
    norm_scores,
    pool_pyramid,
    pyramid_index,
    pyramid_scores,
)
from lighthouse.gather import per_head_index  # noqa: E402
from require_cuda import require_cuda  # noqa: E402  (scripts/, the script's own folder)

B, H, G, D, DTYPE, LEVELS, POOL = 1, 8, 8, 128, torch.bfloat16, 3, 4
DEFAULT_NS = [8192 * 2**i for i in range(7)]


def median_ms(fn, long_threshold_ms: float = 100.0) -> float:
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


def qkv(n: int, heads: int = H, kv_heads: int = G, grad: bool = True):
    return tuple(torch.randn(B, n, x, D, device="cuda", dtype=DTYPE, requires_grad=grad) for x in (heads, kv_heads, kv_heads))


def fwd_and_fwd_bwd(fn, q, k, v) -> tuple[float, float]:
    grad_o = torch.randn_like(q)
    with torch.no_grad():
        fwd = median_ms(lambda: fn(q, k, v))
    fwd_bwd = median_ms(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), grad_o))
    return fwd, fwd_bwd


def cudnn(q, k, v):
    return causal_attention(q, k, v, "cudnn")


def budgets(n: int) -> list[int]:
    return sorted({2048, n // 64})


def valid(n: int, topk: int) -> bool:
    try:
        LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk).validate(n)
        return True
    except ValueError:
        return False


def bench_points(ns: list[int], device: str, selections: list[str]) -> list[dict]:
    points = []
    for n in ns:
        q, k, v = qkv(n)
        dense = fwd_and_fwd_bwd(cudnn, q, k, v)
        for topk, selection in ((t, sel) for t in budgets(n) for sel in selections):
            config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend="cudnn", selection=selection)
            try:
                s = config.gathered_len(n)
            except ValueError as err:
                print(f"N={n} k={topk}: skipped ({err})", flush=True)
                continue
            lh = fwd_and_fwd_bwd(lambda *x: fused_lighthouse_attention(*x, config), q, k, v)
            ceiling = fwd_and_fwd_bwd(cudnn, *qkv(s))
            points.append(dict(device=device, N=n, levels=LEVELS, pool=POOL, topk=topk, S=s, selection=selection,
                               lh_fwd_ms=lh[0], lh_fwd_bwd_ms=lh[1], sdpa_fwd_ms=dense[0],
                               sdpa_fwd_bwd_ms=dense[1], sdpa_on_S_fwd_ms=ceiling[0],
                               sdpa_on_S_fwd_bwd_ms=ceiling[1]))
            p = points[-1]
            print(f"N={n:>7} k={topk:>5} {selection:>6} S={s:>6}  LH {p['lh_fwd_ms']:8.3f} / {p['lh_fwd_bwd_ms']:8.3f} ms   "
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


def stage_breakdown(n: int, topk: int, bandwidth: float) -> list[tuple[str, float, float | None]]:
    """(stage, ms, achieved GB/s or None) of each stage, forward then backward, at one point."""
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend="cudnn")
    q, k, v = qkv(n)
    es = 2  # bytes per bf16 element
    row = D * es
    with torch.no_grad():
        pyramid = pool_and_score(q, k, v, POOL, LEVELS)
        packed = select_packed(pyramid.sq, pyramid.sk, n, config)
        slots = slot_map(packed, n, POOL, LEVELS)
    s = packed.shape[-1]
    np_, ntot = pyramid.q.shape[1], pyramid.sq.shape[-1]
    heads = H + 2 * G
    qt, kt, vt = gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS)
    ot = cudnn(qt, kt, vt)
    o = scatter_back(ot, packed, slots, n, POOL, LEVELS)
    grad_o = torch.randn_like(o)
    grad_ot = torch.randn_like(ot)
    grads_t = [torch.randn_like(x) for x in (qt, kt, vt)]
    out = []

    def add(name, fn, nbytes=None):
        ms = median_ms(fn)
        out.append((name, ms, nbytes / ms / 1e6 if nbytes else None))

    with torch.no_grad():
        add("fwd pool+scores", lambda: pool_and_score(q, k, v, POOL, LEVELS),
            B * (n + np_) * heads * row + 2 * B * G * ntot * 4)
        add("fwd select (tile kernel + per-tile sort)", lambda: select_packed(pyramid.sq, pyramid.sk, n, config))
        add("fwd slot map", lambda: slot_map(packed, n, POOL, LEVELS), B * G * (ntot + s) * 4 + B * G * s * 8)
        add("fwd gather", lambda: gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS),
            2 * B * s * heads * row + B * G * s * 8)
        add("fwd SDPA on S", lambda: cudnn(qt, kt, vt))
        add("fwd scatter", lambda: scatter_back(ot, packed, slots, n, POOL, LEVELS),
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


def agreement(eager, other) -> str:
    """How a compiled or captured run's (o, dq, dk, dv) compare with eager's."""
    worst = max(error_ratio(a, b)[0] for a, b in zip(eager[1:], other[1:]))
    return f"o bit-identical to eager: {torch.equal(eager[0], other[0])}, largest gradient error ratio {worst:.1e}"


def host_overhead_ms(fn, calls: int = 50) -> tuple[float, float]:
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


def capture(fn):
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


def graph_capture_report(n: int, config: LighthouseConfig, layer) -> list[str]:
    """Capture each stage alone in a CUDA graph (to find any that cannot be captured), plain cuDNN SDPA and
    the reference layer for comparison, then the fused layer's forward+backward. All inputs are drawn
    first (a failed capture leaves the random generator unusable), and the leaves that are captured have
    no autograd graph alive from an eager run on the default stream (which breaks capture)."""
    q, k, v = qkv(n, grad=False)
    leaves = qkv(n)
    grad_o = torch.randn_like(leaves[0])

    def step(fn):
        o = fn(*leaves)
        return (o, *torch.autograd.grad(o, leaves, grad_o))

    eager = tuple(x.detach() for x in step(layer))
    pyramid = pool_and_score(q, k, v, POOL, LEVELS)
    packed = select_packed(pyramid.sq, pyramid.sk, n, config)
    slots = slot_map(packed, n, POOL, LEVELS)
    qt, kt, vt = gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS)
    qg, kg, vg = (x.detach().requires_grad_() for x in (qt, kt, vt))
    grad_t = torch.randn_like(qt)
    others = {b: LighthouseConfig(levels=LEVELS, pool=POOL, topk=config.topk, backend=b) for b in ("flash", "efficient")}
    forward_only = {
        "pool+scores": lambda: pool_and_score(q, k, v, POOL, LEVELS),
        "select": lambda: select_packed(pyramid.sq, pyramid.sk, n, config),
        "slot map": lambda: slot_map(packed, n, POOL, LEVELS),
        "gather": lambda: gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS),
        "scatter": lambda: scatter_back(qt, packed, slots, n, POOL, LEVELS),
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
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=max(128, n // 64), backend="cudnn")
    q, k, v = qkv(n)
    grad_o = torch.randn_like(q)

    def step(fn):
        o = fn(q, k, v)
        return (o, *torch.autograd.grad(o, (q, k, v), grad_o))

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
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend="cudnn")
    q, k, v = qkv(n, grad=False)
    notes = []

    def reference_pool_scores(q_, k_, v_):
        pooled = [torch.cat(pool_pyramid(x, POOL, LEVELS)[1:], dim=1) for x in (q_, k_, v_)]
        sq, sk = norm_scores(q_, k_)
        return pooled, [torch.cat(pyramid_scores(s, POOL, LEVELS), dim=-1) for s in (sq, sk)]

    triton_ms = median_ms(lambda: pool_and_score(q, k, v, POOL, LEVELS))
    pool_bytes = B * (n + q.shape[1] // POOL + q.shape[1] // POOL**2) * (H + 2 * G) * D * 2
    for tokens in (32, 64, 128, 256):
        for warps in (4, 8):
            ms = median_ms(lambda: pool_and_score(q, k, v, POOL, LEVELS, tokens_per_program=tokens, num_warps=warps))
            notes.append(f"N={n} pool+scores variant tokens/program={tokens} warps={warps}: {ms:.3f} ms, "
                         f"{pool_bytes / ms / 1e6:.0f} GB/s")
    try:
        compiled = torch.compile(reference_pool_scores)
        compiled_ms = median_ms(lambda: compiled(q, k, v))
        notes.append(f"N={n} pool+scores: Triton {triton_ms:.3f} ms, torch.compile of the reference {compiled_ms:.3f} ms")
    except Exception as err:
        notes.append(f"N={n} pool+scores: Triton {triton_ms:.3f} ms, torch.compile failed: {type(err).__name__}: {err}")
    pyramid = pool_and_score(q, k, v, POOL, LEVELS)
    packed = select_packed(pyramid.sq, pyramid.sk, n, config)
    slots = slot_map(packed, n, POOL, LEVELS)
    flat = pyramid_index(selection_of(packed, config), n, POOL, LEVELS)
    concatenated = [torch.cat([x, p], dim=1) for x, p in zip((q, k, v), pyramid[:3])]
    idx = [per_head_index(flat, x.shape[2], D) for x in concatenated]
    torch_ms = median_ms(lambda: [torch.gather(x, 1, i) for x, i in zip(concatenated, idx)])
    fused_ms = median_ms(lambda: gather_pyramid(q, k, v, pyramid, packed, slots, POOL, LEVELS))
    notes.append(f"N={n} k={topk} gather of Q~,K~,V~: Triton {fused_ms:.3f} ms, torch.gather on the concatenated "
                 f"pyramid {torch_ms:.3f} ms (index precomputed, concatenation not timed)")
    return notes


def tables(points: list[dict]) -> str:
    lines = ["| N | k | selection | S | LH fwd ms | SDPA fwd ms | fwd speed-up | SDPA(S) fwd ms | LH fwd+bwd ms | "
             "SDPA fwd+bwd ms | fwd+bwd speed-up | SDPA(S) fwd+bwd ms |", "|" + "---|" * 12]
    for p in points:
        lines.append(
            f"| {p['N']:,} | {p['topk']:,} | {p.get('selection', 'paper')} | {p['S']:,} | {p['lh_fwd_ms']:.3f} | {p['sdpa_fwd_ms']:.2f} | "
            f"{p['sdpa_fwd_ms'] / p['lh_fwd_ms']:.1f}x | {p['sdpa_on_S_fwd_ms']:.3f} | {p['lh_fwd_bwd_ms']:.3f} | "
            f"{p['sdpa_fwd_bwd_ms']:.2f} | {p['sdpa_fwd_bwd_ms'] / p['lh_fwd_bwd_ms']:.1f}x | "
            f"{p['sdpa_on_S_fwd_bwd_ms']:.3f} |")
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
        ax.set_title(f"{points[0]['device']}: one layer, {title} (B=1, H=8, D=128, bf16, L=3, p=4)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(directory / f"bench_attention_{key}.png", dpi=130)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default=",".join(map(str, DEFAULT_NS)), help="comma-separated sequence lengths")
    parser.add_argument("--stages", default="524288", help="N values for the per-stage breakdown ('' for none)")
    parser.add_argument("--checks", type=int, default=0, help="N for the torch.compile / CUDA-graph check (0: skip)")
    parser.add_argument("--extras", action="store_true", help="pooling vs torch.compile, gather vs torch.gather")
    parser.add_argument("--selection", default="paper", help="comma-separated selection modes to time (paper,causal)")
    parser.add_argument("--out", default="outputs/bench_attention",
                        help="folder for bench_attention.json, tables and plots (docs/ to publish)")
    parser.add_argument("--once", type=int, default=0, help="only run one fwd+bwd at this N, k=2048 (for ncu)")
    args = parser.parse_args()
    require_cuda()
    if args.once:
        q, k, v = qkv(args.once)
        config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=2048, backend="cudnn")
        torch.autograd.grad(fused_lighthouse_attention(q, k, v, config), (q, k, v), torch.randn_like(q))
        torch.cuda.synchronize()
        return

    props = torch.cuda.get_device_properties(0)
    device = props.name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {device}: torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
          f"triton {triton.__version__}", flush=True)
    bandwidth = hbm_copy_gbps()
    print(f"HBM copy bandwidth (read+write): {bandwidth:.0f} GB/s", flush=True)
    sections = [f"Device: {device}; torch {torch.__version__}; CUDA {torch.version.cuda}; cuDNN "
                f"{torch.backends.cudnn.version()}; Triton {triton.__version__}; measured copy bandwidth "
                f"{bandwidth:.0f} GB/s; command: python {' '.join(sys.argv)}"]

    t0 = time.perf_counter()
    points = bench_points([int(x) for x in args.ns.split(",") if x], device, args.selection.split(","))
    if points:
        (out / "bench_attention.json").write_text(json.dumps(points, indent=1) + "\n")
        sections.append(tables(points))
        plot(points, out)
    print(f"[latency sweep {time.perf_counter() - t0:.0f}s]", flush=True)
    for n in [int(x) for x in args.stages.split(",") if x]:
        for topk in budgets(n):
            if not valid(n, topk):
                continue
            rows = stage_breakdown(n, topk, bandwidth)
            table = [f"Stages at N={n:,}, k={topk:,}:", "", "| stage | ms | GB/s | % of copy bandwidth |",
                     "|---|---|---|---|"]
            for name, ms, gbps in rows:
                share = f"{gbps:.0f} | {100 * gbps / bandwidth:.0f}%" if gbps else "- | -"
                table.append(f"| {name} | {ms:.3f} | {share} |")
            sections.append("\n".join(table))
            print(sections[-1], flush=True)
    for wanted, run in ((args.extras, lambda: extras(524288, 2048)),
                        (args.checks, lambda: check_compile_and_graphs(args.checks))):
        if not wanted:
            continue
        try:
            notes = run()
        except Exception as err:  # keep what was measured so far
            notes = [f"{type(err).__name__}: {str(err)[:300]}"]
        sections.append("\n".join(f"- {x}" for x in notes))
        print(sections[-1], flush=True)
    (out / "bench_tables.md").write_text("\n\n".join(sections) + "\n")
    print("\n" + sections[1] if points else "", flush=True)


if __name__ == "__main__":
    main()
