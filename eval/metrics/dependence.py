"""Structural causality probe of one Lighthouse layer: which earlier rows move when a later token changes.

For a later position j, k and v at j are replaced by fresh values (k scaled up, so the scores move too) and
the reference layer runs again, in float64 on the CPU. An earlier row t < j *moved* if its output changed in
any bit, or the gradient of a loss on the rows < j with respect to q, k or v at row t did. A strictly causal
layer moves no row, for any input; "causal" selection still moves some through the tile ranking
(SPEC section 3a), and `reach` says how many rows and how far back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lighthouse.config import LighthouseConfig
from lighthouse.reference import reference_lighthouse_attention

KEY_SCALE = 10.0  # the perturbed key's scale: large, so it changes which entries score highest


@dataclass(frozen=True)
class Reach:
    """How far back the probed later positions reached: over all of them, the earlier rows whose output moved
    (`output_*`) and whose output or input gradient moved (`any_*`); a row counts once per position."""

    positions: int
    leaking_positions: int
    output_rows: int
    output_distance: int
    any_rows: int
    any_distance: int


def _outputs_and_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                       config: LighthouseConfig, upto: int) -> list[torch.Tensor]:
    """[o, dq, dk, dv] of the loss sum(o[:, :upto] * weight[:, :upto]), each cut to the rows < upto."""
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    o = reference_lighthouse_attention(q, k, v, config)
    grads = torch.autograd.grad((o[:, :upto] * weight[:, :upto]).sum(), (q, k, v))
    return [x[:, :upto].detach() for x in (o, *grads)]


def _rows_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, R, heads, D] pair -> [R] mask of the rows where any bit differs."""
    return (a != b).flatten(2).any(-1).any(0)


def moved_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, j: int,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows t < j whose output moved, rows t < j whose output or input gradient moved) when k and v at j are
    replaced; gradients are those of q, k, v at t for a random-weighted loss on the rows < j. q, k, v
    [B, N, H or G, D] float64 on the CPU; a row moved if any bit changed."""
    weight = torch.randn(q.shape, dtype=q.dtype, generator=generator)
    k2, v2 = k.clone(), v.clone()
    k2[:, j] = KEY_SCALE * torch.randn(k[:, j].shape, dtype=k.dtype, generator=generator)
    v2[:, j] = torch.randn(v[:, j].shape, dtype=v.dtype, generator=generator)
    before = _outputs_and_grads(q, k, v, weight, config, j)
    after = _outputs_and_grads(q, k2, v2, weight, config, j)
    output = _rows_differ(before[0], after[0])
    moved = output.clone()
    for a, b in zip(before[1:], after[1:]):
        moved |= _rows_differ(a, b)
    return output.nonzero().flatten(), moved.nonzero().flatten()


def reach(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, positions: list[int],
          generator: torch.Generator | None = None) -> Reach:
    """`moved_rows` over the probed `positions`, summed: positions that moved any earlier row, earlier rows
    moved in all and the largest j - t of a moved row t, for outputs and for outputs or gradients."""
    leaking, counts, distances = 0, [0, 0], [0, 0]
    for j in positions:
        found = moved_rows(q, k, v, config, j, generator)
        leaking += int(found[1].numel() > 0)
        for i, rows in enumerate(found):
            if rows.numel():
                counts[i] += rows.numel()
                distances[i] = max(distances[i], j - int(rows.min()))
    return Reach(len(positions), leaking, counts[0], distances[0], counts[1], distances[1])
