"""Stage 5: scatter each gathered output row back to a shifted range of base positions (SPEC section 5).

An entry at level l, index i writes to R(l,i) = [i*c + c - 1, i*c + 2c - 2] (c = p**l), clipped to the
sequence: the shift by c - 1 keeps causality. Contributions are summed in float32 and cast once; the
backward is the sum of the output gradient over R(l,i). Both directions are plain reshapes and sums
(no atomics), so results are bit-identical run after run.
"""
from __future__ import annotations

import torch

from .gather import per_head_index
from .pyramid import level_offsets


def _shifted_windows(buf: torch.Tensor, seq_len: int, span: int) -> torch.Tensor:
    """View of padded positions [span-1, span-1+N) of `buf [B, N+pad, H, D]` as [B, N/span, span, H, D]."""
    b, _, h, d = buf.shape
    return buf[:, span - 1 : span - 1 + seq_len].view(b, seq_len // span, span, h, d)


class ScatterBack(torch.autograd.Function):
    """o_tilde [B, S, H, D] -> o [B, N, H, D], given each row's index into the concatenated pyramid."""

    @staticmethod
    def forward(ctx, o_tilde: torch.Tensor, flat_index: torch.Tensor, seq_len: int, pool: int, levels: int,
                spill: bool):
        b, _, h, d = o_tilde.shape
        acc = torch.promote_types(o_tilde.dtype, torch.float32)
        offsets = level_offsets(seq_len, pool, levels)
        entries = offsets[-1] + seq_len // pool ** (levels - 1)
        idx = per_head_index(flat_index, h, d)
        per_entry = o_tilde.new_zeros(b, entries, h, d, dtype=acc).scatter_(1, idx, o_tilde.to(acc))
        out = o_tilde.new_zeros(b, seq_len + pool ** (levels - 1) - 1, h, d, dtype=acc)
        for lvl, off in enumerate(offsets):
            span = pool**lvl
            _shifted_windows(out, seq_len, span).add_(per_entry[:, off : off + seq_len // span].unsqueeze(2))
        ctx.save_for_backward(idx)
        ctx.shape = (seq_len, pool, levels, o_tilde.dtype)
        return (out if spill else out[:, :seq_len]).to(o_tilde.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (idx,) = ctx.saved_tensors
        seq_len, pool, levels, dtype = ctx.shape
        b, _, h, d = grad_out.shape
        acc = torch.promote_types(grad_out.dtype, torch.float32)
        padded = grad_out.new_zeros(b, seq_len + pool ** (levels - 1) - 1, h, d, dtype=acc)
        padded[:, : grad_out.shape[1]] = grad_out
        window_sums = [_shifted_windows(padded, seq_len, pool**lvl).sum(dim=2) for lvl in range(levels)]
        grad = torch.gather(torch.cat(window_sums, dim=1), 1, idx)
        return grad.to(dtype), None, None, None, None, None


def scatter_back(
    o_tilde: torch.Tensor, flat_index: torch.Tensor, seq_len: int, pool: int, levels: int, spill: bool = False
) -> torch.Tensor:
    """Sum every gathered row into its shifted range R(l, i); see ScatterBack.

    By default ranges are clipped to [0, seq_len). With `spill=True` the output keeps the
    pool**(levels-1) - 1 positions past the end that ranges reach into (for a sequence shard whose
    neighbour lives elsewhere, as under context parallelism).
    """
    return ScatterBack.apply(o_tilde, flat_index, seq_len, pool, levels, spill)
