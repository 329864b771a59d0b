"""Parity of the fused GPU path with the pure-PyTorch reference, on the same GPU, at large sizes
(scripts/gpu_parity.py).

Per case:
  select   the tile kernel on the reference's scores equals `lighthouse.descend`, index for index;
  scores   the fused pooling pass's score pyramids against the reference's (error ratio), and how many
           (batch, kv-head) rows get a different selection from them (float rounding near ties);
  layer    the fused pipeline on the reference's scores against the reference layer: o, dq, dk, dv
           error ratios (RMSE(ref - fast) / RMS(ref)) under the tolerance of `lighthouse/testing.py`;
  e2e      the whole fused layer (its own scores) against the reference layer;
  determ.  two runs give bit-identical o, and bit-identical gradients from the fused backward kernels
           (scatter-back, gather+pooling) for the same upstream gradients; whether the whole layer's
           gradients repeat bit for bit is reported too (it also depends on the inner SDPA backward).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch
import triton

from kernels.gather import gather_pyramid
from kernels.pyramid import Pyramid, pool_and_score
from kernels.scatter import scatter_back
from lighthouse import (
    LighthouseConfig,
    descend,
    pyramid_scores,
    reference_lighthouse_attention,
    token_scores,
)
from lighthouse.fused import Plan, attend, pyramid_levels_to_store, select_gather_order, selection_of
from lighthouse.fused_node import fused_lighthouse_attention
from lighthouse.testing import ERROR_RATIO, error_ratio

# (B, N, H, G, D, dtype, LighthouseConfig kwargs); the paper's selection, whose scores the pooling pass computes
CASES = [
    (1, 8192, 8, 8, 128, torch.bfloat16, dict(levels=3, pool=4, topk=128, selection="paper")),
    (2, 65536, 8, 2, 128, torch.bfloat16, dict(levels=3, pool=4, topk=2048, selection="paper")),
    (1, 131072, 8, 8, 64, torch.bfloat16, dict(levels=4, pool=2, topk=1024, tile_budget=64, selection="paper")),
    (1, 32768, 4, 4, 128, torch.float32, dict(levels=2, pool=8, topk=512, backend="efficient", selection="paper")),
    (1, 262144, 8, 4, 128, torch.bfloat16, dict(levels=3, pool=4, topk=4096, tile_budget=256, selection="paper")),
    (1, 16384, 8, 8, 128, torch.bfloat16,
     dict(levels=3, pool=4, topk=256, scorer="dilated", dilation=4, selection="paper")),
    (1, 524288, 8, 8, 128, torch.bfloat16, dict(levels=3, pool=4, topk=2048, selection="paper")),
    (1, 524288, 8, 8, 128, torch.bfloat16, dict(levels=3, pool=4, topk=8192, selection="paper")),
]
QUICK = [0, 1, 3, 6]

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def fwd_bwd(fn: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_o: torch.Tensor
            ) -> tuple[torch.Tensor, ...]:
    """(o, dq, dk, dv) of fn on the leaves q, k, v for the upstream gradient grad_o."""
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_o))


def ratios(ref: Sequence[torch.Tensor], fast: Sequence[torch.Tensor]) -> list[float]:
    """Error ratio of each fast tensor against its reference."""
    return [error_ratio(r, f)[0] for r, f in zip(ref, fast)]


def backward_kernels_repeat(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pyramid: Pyramid, sq: torch.Tensor,
                            sk: torch.Tensor, config: LighthouseConfig) -> bool:
    """The scatter-back and gather+pooling backward kernels give bit-identical gradients twice."""
    n, pool, levels = q.shape[1], config.pool, config.levels
    packed, slots = select_gather_order(sq, sk, n, config)
    gathered = gather_pyramid(q, k, v, pyramid, packed, slots, pool, levels)
    o_t = torch.randn_like(gathered[0], requires_grad=True)
    o = scatter_back(o_t, slots, n, pool, levels)
    grad_o = torch.randn_like(o)
    grads_t = [torch.randn_like(x) for x in gathered]
    runs = [(*torch.autograd.grad(o, o_t, grad_o, retain_graph=True),
             *torch.autograd.grad(gathered, (q, k, v), grads_t, retain_graph=True)) for _ in range(2)]
    return all(torch.equal(a, b) for a, b in zip(*runs))


def run_case(b: int, n: int, h: int, g: int, d: int, dtype: torch.dtype, kwargs: dict[str, Any]) -> bool:
    """Run every check of one case (B, N, H, G, D, dtype, config), print one line; whether all passed."""
    config = LighthouseConfig(**kwargs)
    name = (f"B{b} N{n} H{h} G{g} D{d} {str(dtype)[6:]} L{config.levels} p{config.pool} k{config.topk} "
            f"m{config.tile_budget} {config.scorer}")
    q, k, v = (torch.randn(b, n, heads, d, device="cuda", dtype=dtype, requires_grad=True) for heads in (h, g, g))
    grad_o = torch.randn_like(q)
    tol = ERROR_RATIO[dtype]
    ok = True
    start = time.perf_counter()

    with torch.no_grad():
        ref_levels = [pyramid_scores(s, config.pool, config.levels, config.selection)
                      for s in token_scores(q, k, v, config)]
        ref_sq, ref_sk = (torch.cat(s, dim=-1) for s in ref_levels)
        ref_sel = descend(*ref_levels, config)
        fast_sel = selection_of(select_gather_order(ref_sq, ref_sk, n, config).packed, config)
        same = all(torch.equal(getattr(fast_sel, f), getattr(ref_sel, f)) for f in ("level", "index", "expanded"))
        ok &= same
        pyramid = pool_and_score(q, k, v, config.pool, config.levels, scores=config.scorer == "norm",
                                 stored=pyramid_levels_to_store(n, config))
        line = f"select={'exact' if same else 'MISMATCH'}"
        if config.scorer == "norm":
            score_err = max(error_ratio(ref_sq, pyramid.sq)[0], error_ratio(ref_sk, pyramid.sk)[0])
            own = selection_of(select_gather_order(pyramid.sq, pyramid.sk, n, config).packed, config)
            rows_differ = (own.index != ref_sel.index).any(-1).sum().item()
            line += f" scores={score_err:.1e} rows-differing-by-score-rounding={rows_differ}/{b * g}"
            ok &= score_err < 1e-6

    ref = fwd_bwd(lambda *x: reference_lighthouse_attention(*x, config), q, k, v, grad_o)
    ref_order = select_gather_order(ref_sq, ref_sk, n, config)
    ref_scored = fwd_bwd(lambda q_, k_, v_: attend(q_, k_, v_, Plan(pyramid, ref_order), config), q, k, v, grad_o)
    layer = ratios(ref, ref_scored)
    ok &= max(layer) <= tol
    fused = fwd_bwd(lambda *x: fused_lighthouse_attention(*x, config), q, k, v, grad_o)
    again = fwd_bwd(lambda *x: fused_lighthouse_attention(*x, config), q, k, v, grad_o)
    e2e = ratios(ref, fused)
    kernels_repeat = backward_kernels_repeat(q, k, v, pyramid, ref_sq, ref_sk, config)
    determ = torch.equal(fused[0], again[0]) and kernels_repeat
    layer_grads_repeat = all(torch.equal(a, c) for a, c in zip(fused[1:], again[1:]))
    ok &= determ
    fmt = lambda r: "/".join(f"{x:.1e}" for x in r)  # noqa: E731
    line += (f" layer(o/dq/dk/dv)={fmt(layer)} e2e={fmt(e2e)} bit-identical(o, kernel grads)={determ}"
             f" (layer grads: {layer_grads_repeat}) tol={tol:.0e}"
             f" [{time.perf_counter() - start:.1f}s] {'OK' if ok else 'FAIL'}")
    print(f"{name}: {line}", flush=True)
    return ok


def run_parity(quick: bool) -> bool:
    """Run every case (or the QUICK ones), one line each, then the count passed; whether all passed. A case
    that raises is reported and counted as failed, and the others still run."""
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"triton {triton.__version__}")
    cases = [CASES[i] for i in QUICK] if quick else CASES
    failed = 0
    for case in cases:
        try:
            failed += not run_case(*case)
        except Exception as err:  # report and go on: one broken case must not hide the others
            failed += 1
            print(f"{case}: ERROR {type(err).__name__}: {err}", flush=True)
        torch.cuda.empty_cache()
    print(f"{len(cases) - failed}/{len(cases)} cases passed")
    return failed == 0
