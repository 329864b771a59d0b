"""Parity of the fused GPU path with the pure-PyTorch reference, on the same GPU, at large sizes
(scripts/gpu_parity.py), through the public entries: the layer (`lighthouse_attention`,
`reference_lighthouse_attention`) and the two implementations' `plan`/`attend` (`lighthouse.fused`,
`lighthouse.reference`).

Per case:
  select   the fused plan on the reference's level-0 scores selects what the reference plan selects, index
           for index;
  scores   the fused pooling pass's score pyramids against the reference's (error ratio), and how many
           (batch, kv-head) rows get a different selection from them (float rounding near ties);
  layer    the fused `attend` on the reference-scored plan against the reference layer: o, dq, dk, dv
           error ratios (RMSE(ref - fast) / RMS(ref)) under the tolerance of `lighthouse/testing.py`;
  e2e      the whole fused layer (its own scores) against the reference layer;
  determ.  two runs give bit-identical o, and bit-identical gradients from the fused backward kernels
           (scatter-back, gather+pooling) for the same upstream gradients; whether the whole layer's
           gradients repeat bit for bit is reported too (it also depends on the inner SDPA backward).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import torch
import triton

from lighthouse import (
    LighthouseConfig,
    fused,
    fused_ops,
    lighthouse_attention,
    pyramid_scores,
    reference,
    reference_lighthouse_attention,
    token_scores,
)
from lighthouse.testing import ERROR_RATIO, error_ratio

# (B, N, H, G, D, dtype, LighthouseConfig kwargs); the paper's selection, whose scores the pooling pass computes,
# then the causal selection (the recipe's default; causal pyramid scores) and last the strict selection's online
# kernel (SPEC section 3a) on its trailing-window scores
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
    (2, 65536, 8, 2, 128, torch.bfloat16, dict(levels=3, pool=4, topk=2048, selection="causal")),
    (1, 524288, 8, 8, 128, torch.bfloat16, dict(levels=3, pool=4, topk=2048, selection="causal")),
    (2, 65536, 8, 2, 128, torch.bfloat16, dict(levels=3, pool=4, topk=2048, selection="strict")),
]
QUICK = [0, 1, 3, 6, 8]

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def fwd_bwd(fn: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_o: torch.Tensor
            ) -> tuple[torch.Tensor, ...]:
    """(o, dq, dk, dv) of fn on the leaves q, k, v for the upstream gradient grad_o."""
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_o))


def ratios(ref: Sequence[torch.Tensor], fast: Sequence[torch.Tensor]) -> list[float]:
    """Error ratio of each fast tensor against its reference."""
    return [error_ratio(r, f)[0] for r, f in zip(ref, fast)]


def backward_kernels_repeat(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: fused.Plan,
                            config: LighthouseConfig) -> bool:
    """The scatter-back and gather+pooling backward kernels give bit-identical gradients twice for the same
    upstream gradients. They are called one by one (`lighthouse.fused_ops`): through `attend` the gradients
    would also pass the inner SDPA backward, which need not repeat."""
    n, pool, levels, order = q.shape[1], config.pool, config.levels, plan.order
    gathered = fused_ops.gather_pyramid(q, k, v, plan.pyramid, order.packed, order.slots, pool, levels)
    o_t = torch.randn_like(gathered[0], requires_grad=True)
    o = fused_ops.scatter_back(o_t, order.slots, n, pool, levels)
    grad_o = torch.randn_like(o)
    grads_t = [torch.randn_like(x) for x in gathered]
    runs = [(*torch.autograd.grad(o, o_t, grad_o, retain_graph=True),
             *torch.autograd.grad(gathered, (q, k, v), grads_t, retain_graph=True)) for _ in range(2)]
    return all(torch.equal(a, b) for a, b in zip(*runs))


def run_case(b: int, n: int, h: int, g: int, d: int, dtype: torch.dtype, kwargs: dict[str, Any],
             device: str = "cuda") -> bool:
    """Run every check of one case (B, N, H, G, D, dtype, config) on `device` (CPU: Triton's interpreter, small
    sizes), print one line; whether all passed."""
    config = LighthouseConfig(**kwargs)
    name = (f"B{b} N{n} H{h} G{g} D{d} {str(dtype)[6:]} L{config.levels} p{config.pool} k{config.topk} "
            f"m{config.tile_budget} {config.scorer}")
    q, k, v = (torch.randn(b, n, heads, d, device=device, dtype=dtype, requires_grad=True) for heads in (h, g, g))
    grad_o = torch.randn_like(q)
    tol = ERROR_RATIO[dtype]
    ok = True
    start = time.perf_counter()

    level0 = token_scores(q, k, v, config)
    ref_sel = reference.plan(q, k, v, config, scores=level0).selection(config)
    ref_scored = fused.plan(q, k, v, config, scores=level0)
    fast_sel = ref_scored.selection(config)
    same = all(torch.equal(getattr(fast_sel, f), getattr(ref_sel, f)) for f in ("level", "index", "expanded"))
    ok &= same
    line = f"select={'exact' if same else 'MISMATCH'}"
    rows_differ = 0  # rows whose own-score selection differs from the reference's by score rounding
    if config.scorer == "norm":
        own = fused.plan(q, k, v, config)
        ref_sq, ref_sk = (torch.cat(pyramid_scores(s, config.pool, config.levels, config.selection), dim=-1)
                          for s in level0)
        score_err = max(error_ratio(ref_sq, own.pyramid.sq)[0], error_ratio(ref_sk, own.pyramid.sk)[0])
        rows_differ = (own.selection(config).index != ref_sel.index).any(-1).sum().item()
        line += f" scores={score_err:.1e} rows-differing-by-score-rounding={rows_differ}/{b * g}"
        ok &= score_err < 1e-6

    ref = fwd_bwd(lambda *x: reference_lighthouse_attention(*x, config), q, k, v, grad_o)
    layer = ratios(ref, fwd_bwd(lambda *x: fused.attend(*x, ref_scored, config), q, k, v, grad_o))
    ok &= max(layer) <= tol
    fused_config = dataclasses.replace(config, implementation="fused")
    fast, again = (fwd_bwd(lambda *x: lighthouse_attention(*x, fused_config), q, k, v, grad_o) for _ in range(2))
    e2e = ratios(ref, fast)
    if rows_differ == 0:  # else the public layer attends to other entries in those rows: its error is not a parity
        ok &= max(e2e) <= tol
    determ = torch.equal(fast[0], again[0]) and backward_kernels_repeat(q, k, v, ref_scored, config)
    layer_grads_repeat = all(torch.equal(a, c) for a, c in zip(fast[1:], again[1:]))
    ok &= determ
    fmt = lambda r: "/".join(f"{x:.1e}" for x in r)  # noqa: E731
    e2e_text = fmt(e2e) if rows_differ == 0 else f"{fmt(e2e)} (not checked: {rows_differ} rows select otherwise)"
    line += (f" layer(o/dq/dk/dv)={fmt(layer)} e2e={e2e_text} bit-identical(o, kernel grads)={determ}"
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
