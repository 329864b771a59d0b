"""Where the host time of one forward+backward of the fused layer goes, by segment of the autograd call.

At short lengths the layer is bound by the host, and a shared host's speed moves between calls by up to a
third; per-call medians of each segment (stamped on the backward node through its public hooks) stay
comparable where means do not. The layer's own stages are timed alone too (`fused_forward`,
`fused_backward`, no autograd), so what autograd adds around them shows as the difference, next to
autograd's floor: an empty `autograd.Function` forward+backward on the same device.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from lighthouse import LighthouseConfig
from lighthouse.fused_node import fused_backward, fused_forward, fused_lighthouse_attention


class _Identity(torch.autograd.Function):
    """The least an autograd node costs: a view forward, the gradient passed through."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _synchronize() -> None:
    """Let the device catch up now and then, so a long run measures the host, not a full launch queue."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


SEGMENTS = (
    "forward call (autograd.Function.apply around the stages)",
    "autograd.grad until the node's backward starts",
    "node's backward",
    "node's backward done until autograd.grad returns",
    "total",
)


def _medians_us(step: Callable[[], tuple[float, ...]], calls: int, sync_every: int) -> list[float]:
    """Per-position medians in us of the spans (seconds) that step() returns, over `calls` calls after a
    tenth as many warm-up calls, the device caught up every `sync_every` calls."""
    samples = []
    for i in range(calls + calls // 10):
        spans = step()
        if i >= calls // 10:
            samples.append(spans)
        if i % sync_every == 0:
            _synchronize()
    return [statistics.median(column) * 1e6 for column in zip(*samples)]


def _timed(fn: Callable[[], object], calls: int, sync_every: int) -> float:
    """Median host time of fn() in us (`_medians_us`)."""
    def step() -> tuple[float]:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start,)
    return _medians_us(step, calls, sync_every)[0]


def host_segments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_o: torch.Tensor,
                  config: LighthouseConfig, calls: int = 300, sync_every: int = 50) -> list[tuple[str, float]]:
    """(segment, median host us) of `torch.autograd.grad(fused_lighthouse_attention(q, k, v), (q, k, v),
    grad_o)` (`SEGMENTS`), then the stages alone and autograd's floor. q, k, v: contiguous leaves that
    require grad."""
    stamps: dict[str, float] = {}

    def step() -> tuple[float, ...]:
        start = time.perf_counter()
        o = fused_lighthouse_attention(q, k, v, config)
        called = time.perf_counter()
        o.grad_fn.register_prehook(lambda grads: stamps.__setitem__("in", time.perf_counter()))
        o.grad_fn.register_hook(lambda grads_in, grads_out: stamps.__setitem__("out", time.perf_counter()))
        hooked = time.perf_counter()
        torch.autograd.grad(o, (q, k, v), grad_o)
        done = time.perf_counter()
        spans = (called - start, stamps["in"] - hooked, stamps["out"] - stamps["in"], done - stamps["out"])
        return (*spans, sum(spans))

    out = list(zip(SEGMENTS, _medians_us(step, calls, sync_every)))
    detached = [x.detach() for x in (q, k, v)]
    saved = fused_forward(*detached, config)[1:]
    backward_args = (k.shape[2], config.pool, config.levels, config.backend)
    x = torch.randn(16, device=q.device, requires_grad=True)
    out += [
        ("the forward stages alone (fused_forward, no autograd)",
         _timed(lambda: fused_forward(*detached, config), calls, sync_every)),
        ("the backward stages alone (fused_backward, no autograd)",
         _timed(lambda: fused_backward(grad_o, *saved, *backward_args), calls, sync_every)),
        ("an empty autograd.Function forward+backward (autograd's floor)",
         _timed(lambda: torch.autograd.grad(_Identity.apply(x), (x,), x), calls, sync_every)),
    ]
    return out


def segment_table(n: int, topk: int, rows: list[tuple[str, float]]) -> str:
    """`host_segments` as a markdown table."""
    table = [f"Host time of one fwd+bwd at N={n:,}, k={topk:,}, by segment (per-call medians):", "",
             "| segment | us |", "|---|---|"]
    table += [f"| {name} | {us:.1f} |" for name, us in rows]
    return "\n".join(table)
