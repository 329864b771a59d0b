"""`backend="flash_attn"` beside cuDNN on one GPU (scripts/flash_attn_check.py): whether FlashAttention-4
imported, parity, one training step's loss, latency and where `auto` should take it. bf16 throughout; error
ratios are RMSE(ref - x) / RMS(ref) (`lighthouse.testing`), tolerance `ERROR_RATIO[bf16]`.

  attention  causal attention alone (GQA 4:1 and none, D 64 and 128): flash_attn and cuDNN, o, dq, dk, dv,
             each against the math kernel in float32 on the same inputs;
  layer      bf16 geometries of `eval.benchmarks.gpu_parity.CASES` (the same GQA and D, up to 512K, paper and causal
             selection): the fused plan on the reference's scores,
             attended with flash_attn and with cuDNN, against the pure-PyTorch reference layer (cuDNN inner
             attention, as eval/benchmarks/gpu_parity.py), and the whole fused layer with flash_attn against it with
             cuDNN;
  bench      attention on S alone and the whole layer at N = 32K, 128K, 512K (`eval.benchmarks.attention_bench`'s
             geometry and budgets), fwd and fwd+bwd, each backend;
  step       a two-block causal LM with Lighthouse attention (stand-alone: no torchtitan), the loss before and
             after one AdamW step with each backend and with the reference layer;
  crossover  causal attention alone (B 1, H = G = 8, D 128: the paper model's) at lengths from 4K to 128K, fwd+bwd,
             each backend, and the kernel `auto` takes at each: the record's `auto_from` is the shortest length
             from which FlashAttention-4 is faster at every longer one (the value of
             `lighthouse.flash_attn.AUTO_FROM` for the card), and `auto_ok` whether `auto` took the faster kernel
             at every length within `AUTO_SLACK`.

A case that raises is recorded with its message and the others still run. Writes flash_attn_check.json into
the output folder after each part, and flash_attn_bench.png where matplotlib imports (else `replot` draws it
from the record on another machine).
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
import triton

from eval.benchmarks.attention_bench import DTYPE, LEVELS, POOL, budgets, fwd_and_fwd_bwd, qkv, valid
from eval.benchmarks.gpu_parity import CASES, fwd_bwd, ratios
from lighthouse import (
    LighthouseConfig,
    causal_attention,
    fused,
    lighthouse_attention,
    reference,
    reference_lighthouse_attention,
    token_scores,
)
from lighthouse.attention import resolve_backend
from lighthouse.flash_attn import AUTO_FROM, resolve_flash_attn
from lighthouse.fused_node import fused_lighthouse_attention
from lighthouse.testing import ERROR_RATIO
from recipe.logs.run_record import source_commit

BACKENDS = ("cudnn", "flash_attn")
REFERENCE_BACKEND = "cudnn"  # the reference layer's inner attention, as in eval/benchmarks/gpu_parity.py
TOL = ERROR_RATIO[torch.bfloat16]
# distributions whose versions the record names (absent ones are left out)
DISTRIBUTIONS = ("flash-attn-4", "flash-attn", "flash_attn_3", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13",
                 "nvidia-cutlass-dsl-libs-cu12", "quack-kernels", "apache-tvm-ffi", "torch-c-dlpack-ext")
# (B, S, H, G, D) of the attention parity: float32 math holds B*H*S*S scores several times over
ATTENTION_CASES = [(1, 4096, 8, 8, 128), (2, 8192, 8, 2, 128), (1, 8192, 8, 8, 64)]
# eval.benchmarks.gpu_parity.CASES: H8 G8 D128 8K; GQA 4:1 65K; D64 131K (L=4, p=2); 512K; causal selection GQA 4:1 65K
LAYER_CASES = [CASES[i] for i in (0, 1, 2, 6, 8)]
BENCH_NS = [32768, 131072, 524288]
CROSSOVER_S = [4096, 6144, 8192, 12288, 16384, 18432, 20480, 24576, 32768, 49152, 65536, 98304, 131072]
# `auto` may take the slower kernel where the two are this close (relative fwd+bwd time): timing noise
AUTO_SLACK = 0.02


def versions() -> dict[str, str]:
    """Card, torch, CUDA, cuDNN, Triton and the FlashAttention stack's distributions."""
    found = {"device": torch.cuda.get_device_name(), "capability": "sm%d%d" % torch.cuda.get_device_capability(),
             "torch": torch.__version__, "cuda": str(torch.version.cuda),
             "cudnn": str(torch.backends.cudnn.version()), "triton": triton.__version__}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def failure(err: Exception) -> str:
    """An exception as one line of a record."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"


def attention_parity(b: int, s: int, h: int, g: int, d: int) -> dict[str, Any]:
    """Each backend's o, dq, dk, dv against float32 math on the same bf16 inputs."""
    q, k, v = (torch.randn(b, s, x, d, device="cuda", dtype=DTYPE, requires_grad=True) for x in (h, g, g))
    grad_o = torch.randn_like(q)
    wide = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = fwd_bwd(lambda *x: causal_attention(*x, "math"), *wide, grad_o.float())
    row: dict[str, Any] = dict(B=b, S=s, H=h, G=g, D=d)
    for backend in BACKENDS:
        try:
            row[backend] = ratios(ref, fwd_bwd(lambda *x: causal_attention(*x, backend), q, k, v, grad_o))
        except Exception as err:  # a backend without this case: recorded, the rest still runs
            row[backend] = failure(err)
    return row


def layer_parity(b: int, n: int, h: int, g: int, d: int, dtype: torch.dtype, kwargs: dict[str, Any]
                 ) -> dict[str, Any]:
    """The layer of one gpu_parity case: flash_attn and cuDNN on the reference-scored plan against the
    reference layer, and the whole fused layer with flash_attn against it with cuDNN."""
    config = LighthouseConfig(**kwargs)
    q, k, v = (torch.randn(b, n, x, d, device="cuda", dtype=dtype, requires_grad=True) for x in (h, g, g))
    grad_o = torch.randn_like(q)
    level0 = token_scores(q, k, v, config)
    planned = fused.plan(q, k, v, config, scores=level0)
    same = torch.equal(planned.selection(config).index,
                       reference.plan(q, k, v, config, scores=level0).selection(config).index)
    ref = fwd_bwd(lambda *x: reference_lighthouse_attention(*x, dataclasses.replace(config, backend=REFERENCE_BACKEND)),
                  q, k, v, grad_o)
    row: dict[str, Any] = dict(B=b, N=n, H=h, G=g, D=d, levels=config.levels, pool=config.pool, topk=config.topk,
                               selection=config.selection, S=config.gathered_len(n), same_selection=same)
    whole = {}
    for backend in BACKENDS:
        on = dataclasses.replace(config, backend=backend)
        try:
            row[f"{backend}_vs_reference"] = ratios(ref, fwd_bwd(lambda *x: fused.attend(*x, planned, on), q, k, v,
                                                                 grad_o))
            whole[backend] = fwd_bwd(lambda *x: lighthouse_attention(
                *x, dataclasses.replace(on, implementation="fused")), q, k, v, grad_o)
        except Exception as err:
            row[f"{backend}_vs_reference"] = failure(err)
    if len(whole) == len(BACKENDS):
        baseline, tested = BACKENDS
        row[f"{tested}_vs_{baseline}_layer"] = ratios(whole[baseline], whole[tested])
    return row


class TinyLM(torch.nn.Module):
    """Embedding, two pre-norm blocks (Lighthouse attention, SiLU MLP), tied output: a training step without
    torchtitan."""

    def __init__(self, vocab: int, dim: int, heads: int, kv_heads: int, attention: Callable) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.attention = heads, kv_heads, attention
        self.embed = torch.nn.Embedding(vocab, dim)
        torch.nn.init.normal_(self.embed.weight, std=0.02)  # tied: logits of order 1 at the start
        head_dim = dim // heads
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            norm1=torch.nn.RMSNorm(dim), qkv=torch.nn.Linear(dim, (heads + 2 * kv_heads) * head_dim, bias=False),
            out=torch.nn.Linear(dim, dim, bias=False), norm2=torch.nn.RMSNorm(dim),
            up=torch.nn.Linear(dim, 4 * dim, bias=False), down=torch.nn.Linear(4 * dim, dim, bias=False)))
            for _ in range(2))
        self.norm = torch.nn.RMSNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of `tokens` [B, N]."""
        x = self.embed(tokens[:, :-1])
        b, n, dim = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["norm1"](x)).view(b, n, -1, dim // self.heads).split(
                [self.heads, self.kv_heads, self.kv_heads], dim=2)
            x = x + blk["out"](self.attention(q, k, v).reshape(b, n, dim))
            x = x + blk["down"](F.silu(blk["up"](blk["norm2"](x))))
        logits = self.norm(x) @ self.embed.weight.T
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


def training_step(n: int = 32768, topk: int = 512) -> dict[str, Any]:
    """Loss before and after one AdamW step of TinyLM (bf16, N+1 random tokens, L=3, p=4) with the reference
    layer (REFERENCE_BACKEND inside) and with the fused layer on each backend, same initial weights and tokens."""
    config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, selection="paper")
    variants = {"reference": lambda *x: reference_lighthouse_attention(
        *x, dataclasses.replace(config, backend=REFERENCE_BACKEND))}
    for backend in BACKENDS:
        on = dataclasses.replace(config, backend=backend, implementation="fused")
        variants[backend] = lambda *x, on=on: lighthouse_attention(*x, on)
    tokens = torch.randint(0, 256, (1, n + 1), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    row: dict[str, Any] = dict(N=n, topk=topk, dim=1024, heads=8, kv_heads=2, vocab=256)
    for name, attention in variants.items():
        try:
            torch.manual_seed(0)
            model = TinyLM(256, 1024, 8, 2, attention).to("cuda", DTYPE)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            loss = model(tokens)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                row[name] = [loss.item(), model(tokens).item()]
        except Exception as err:
            row[name] = failure(err)
    return row


def bench(n: int, topk: int) -> dict[str, Any]:
    """Median ms of attention on S alone and of the whole fused layer, fwd and fwd+bwd, per backend."""
    s = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, selection="paper").gathered_len(n)
    row: dict[str, Any] = dict(N=n, topk=topk, levels=LEVELS, pool=POOL, S=s)
    q, k, v = qkv(n)
    for backend in BACKENDS:
        config = LighthouseConfig(levels=LEVELS, pool=POOL, topk=topk, backend=backend, selection="paper")
        try:
            row[f"{backend}_S_fwd_ms"], row[f"{backend}_S_fwd_bwd_ms"] = fwd_and_fwd_bwd(
                lambda *x: causal_attention(*x, backend), *qkv(s))
            row[f"{backend}_layer_fwd_ms"], row[f"{backend}_layer_fwd_bwd_ms"] = fwd_and_fwd_bwd(
                lambda *x: fused_lighthouse_attention(*x, config), q, k, v)
        except Exception as err:
            row[f"{backend}_error"] = failure(err)
        torch.cuda.empty_cache()
    return row


def crossover(s: int) -> dict[str, Any]:
    """Median ms of causal attention alone over `s` tokens, fwd and fwd+bwd, per backend, and the kernel
    `auto` takes there."""
    row: dict[str, Any] = dict(S=s, B=1, H=8, G=8, D=128,
                               auto=resolve_backend("auto", torch.device("cuda"), DTYPE, length=s))
    for backend in BACKENDS:
        row[f"{backend}_fwd_ms"], row[f"{backend}_fwd_bwd_ms"] = fwd_and_fwd_bwd(
            lambda *x: causal_attention(*x, backend), *qkv(s))
    return row


def auto_rule(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`auto_from`: the shortest length from which flash_attn's fwd+bwd is faster at every longer one measured
    (None: nowhere); `auto_ok`: whether `auto` took a kernel within `AUTO_SLACK` of the faster at every length;
    `auto_from_in_use`: this card's `AUTO_FROM` entry while measured."""
    timed = sorted((r for r in rows if "flash_attn_fwd_bwd_ms" in r), key=lambda r: r["S"])
    start = None
    for r in reversed(timed):
        if r["flash_attn_fwd_bwd_ms"] >= r["cudnn_fwd_bwd_ms"]:
            break
        start = r["S"]
    ok = all(r[f"{r['auto']}_fwd_bwd_ms"] <= (1 + AUTO_SLACK) * min(r[f"{b}_fwd_bwd_ms"] for b in BACKENDS)
             for r in timed)
    return dict(auto_from=start, auto_ok=ok, auto_from_in_use=AUTO_FROM.get(torch.cuda.get_device_capability()))


def plot(points: list[dict[str, Any]], title: str, path: Path) -> None:
    """Latency against N, forward and forward+backward side by side, per backend and budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, name in ((axes[0], "fwd", "forward"), (axes[1], "fwd_bwd", "forward + backward")):
        for backend, color in zip(BACKENDS, ("tab:blue", "tab:orange")):
            for budget, pick in (("k=2048", lambda p: p["topk"] == 2048),
                                 ("k=N/64", lambda p: p["topk"] == p["N"] // 64)):
                sel = [p for p in points if pick(p) and f"{backend}_layer_{key}_ms" in p]
                style = "-o" if budget == "k=2048" else "--s"
                if sel:
                    ax.plot([p["N"] for p in sel], [p[f"{backend}_layer_{key}_ms"] for p in sel], style, color=color,
                            label=f"layer, {backend}, {budget}")
                    ax.plot([p["N"] for p in sel], [p[f"{backend}_S_{key}_ms"] for p in sel], style, color=color,
                            alpha=0.45, label=f"attention on S, {backend}, {budget}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("median latency (ms)")
        ax.set_title(name, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def fmt(value: Any) -> str:
    """Error ratios as o/dq/dk/dv, a failure as its message."""
    return "/".join(f"{x:.1e}" for x in value) if isinstance(value, list) else f"FAILED ({value})"


def run_check(out: Path) -> bool:
    """Run every part, printing each result as it comes; write the record and the plot into `out`. Whether
    flash_attn imported and passed every parity case under the tolerance."""
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = dict(versions(), commit=source_commit(), command=" ".join(["python", *sys.argv]),
                                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                  tolerance=TOL)
    kernels = resolve_flash_attn()
    record["flash_attn"] = kernels.name if kernels else "not imported"
    print(json.dumps(record), flush=True)
    ok = kernels is not None
    # (part, cases, its function, the key of flash_attn's error ratios that must pass, if any)
    parts: list[tuple[str, list, Callable, str | None]] = [
        ("attention", ATTENTION_CASES, attention_parity, "flash_attn"),
        ("layer", LAYER_CASES, layer_parity, "flash_attn_vs_reference"),
        ("bench", [(n, t) for n in BENCH_NS for t in budgets(n) if valid(n, t)], bench, None),
        ("step", [()], training_step, None),
        ("crossover", [(s,) for s in CROSSOVER_S], crossover, None)]
    for part, cases, run, must_pass in parts:
        record[part] = []
        start = time.perf_counter()
        for case in cases:
            try:
                row = run(*case)
            except Exception as err:  # one broken case must not hide the others
                row = dict(case=str(case), error=failure(err))
            record[part].append(row)
            print(part, {key: fmt(val) if isinstance(val, list) else val for key, val in row.items()}, flush=True)
            if must_pass:
                ok &= isinstance(row.get(must_pass), list) and max(row[must_pass]) <= TOL
            torch.cuda.empty_cache()
        print(f"[{part}: {time.perf_counter() - start:.0f}s]", flush=True)
        if part == "crossover":
            record.update(auto_rule(record[part]))
            print({key: record[key] for key in ("auto_from", "auto_ok", "auto_from_in_use")}, flush=True)
        (out / "flash_attn_check.json").write_text(json.dumps(record, indent=1) + "\n")
    try:
        replot(record, out)
    except ImportError as err:
        print(f"no plot ({err}): run scripts/flash_attn_check.py --replot --out on the record's folder", flush=True)
    print(f"flash_attn parity {'OK' if ok else 'FAILED'}", flush=True)
    return ok


RECORD_KEYS = ("bench", "device", "flash_attn")  # what replot reads of a record


def replot(record: dict, out: Path) -> None:
    """Draw out/flash_attn_bench.png from the benchmark of `record` (out/flash_attn_check.json)."""
    plot(record["bench"], f"{record['device']}: one Lighthouse layer (B=1, H=G=8, D=128, bf16, L=3, p=4), "
         f"{record['flash_attn']} vs cuDNN", out / "flash_attn_bench.png")
