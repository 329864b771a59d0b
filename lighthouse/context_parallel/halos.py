"""What crosses chunk borders: the causal scores before each chunk, and scatter-back spills (SPEC section 6).

Both follow one owner map (`geometry.halo_sources`): chunk c reads from, and sends to, chunk c+1's owner.
One all-gather of the small halos each way (gloo and NCCL).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .geometry import Slot, halo_destinations, halo_sources


def all_gather_stacked(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[W, *x.shape]: every rank's `x` (gloo and NCCL)."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.stack(parts)


def _pick(per_rank: torch.Tensor, slot: Slot | None, like: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """per_rank[rank, HEAD/TAIL] of an all-gathered [W, 2, ...] tensor; `fill` where `slot` is None."""
    return per_rank[slot] if slot is not None else torch.full_like(like, fill)


def score_histories(tails: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The level-0 scores before each owned chunk, from every rank's chunk tails (one all-gather).

    tails [2, ...]: this rank's head and tail chunks' last p**(L-1) - 1 level-0 scores. Returns [2, ...]:
    those of the chunk before each (chunk c reads chunk c-1, the halo map), -inf before chunk 0.
    """
    rank, cp_degree = dist.get_rank(group), dist.get_world_size(group)
    sent = all_gather_stacked(tails, group)
    return torch.stack([_pick(sent, src, tails[0], float("-inf")) for src in halo_sources(rank, cp_degree)])


class FoldHalos(torch.autograd.Function):
    """Per-chunk scatter-backs with spill [B, 2, C + h, H, D] -> this rank's output [B, 2C, H, D] in `dtype`.

    Each owned chunk's spill (its last h rows) goes to the owner of the next chunk, which adds it to its
    first h positions before the one cast to `dtype` (zeros before chunk 0; the last chunk's spill is
    dropped, as on one device). backward returns to each sender the gradient of the positions its halo was
    added to. One pass over the output each way.
    """

    @staticmethod
    def forward(ctx, spilled: torch.Tensor, chunk_len: int, dtype: torch.dtype, group: dist.ProcessGroup):
        rank, cp_degree = dist.get_rank(group), dist.get_world_size(group)
        width = spilled.shape[2] - chunk_len
        spills = spilled[:, :, chunk_len:].transpose(0, 1)  # [2, B, h, H, D]
        sent = all_gather_stacked(spills, group)
        halo = torch.stack([_pick(sent, src, spills[0]) for src in halo_sources(rank, cp_degree)], dim=1)
        out = spilled[:, :, :chunk_len].to(dtype, copy=True)
        out[:, :, :width] = spilled[:, :, :width] + halo
        ctx.meta = (group, width, spilled.dtype)
        return out.flatten(1, 2)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        group, width, acc = ctx.meta
        rank, cp_degree = dist.get_rank(group), dist.get_world_size(group)
        b, n, *rest = grad_out.shape
        grad_out = grad_out.reshape(b, 2, n // 2, *rest)
        heads = grad_out[:, :, :width].transpose(0, 1)  # [2, B, h, H, D]: the halos' gradients
        received = all_gather_stacked(heads, group)
        grad = grad_out.new_empty(b, 2, n // 2 + width, *rest, dtype=acc)
        grad[:, :, : n // 2] = grad_out
        grad[:, :, n // 2:] = torch.stack(
            [_pick(received, dst, heads[0]) for dst in halo_destinations(rank, cp_degree)], dim=1
        )
        return grad, None, None, None
