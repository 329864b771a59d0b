"""Stage 4a: gather the selected pyramid entries into a dense sub-sequence (SPEC section 4)."""
from __future__ import annotations

import torch

from .pyramid import level_offsets
from .selection import Selection


def pyramid_index(selection: Selection, seq_len: int, pool: int, levels: int) -> torch.Tensor:
    """Index [B, G, S] of each selected entry in the concatenation of all pyramid levels."""
    offsets = torch.tensor(level_offsets(seq_len, pool, levels), device=selection.index.device)
    return offsets[selection.level] + selection.index


def per_head_index(flat_index: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """[B, G, S] entry indices -> [B, S, heads, dim] gather/scatter index over `heads` (GQA-aware)."""
    b, g, s = flat_index.shape
    idx = flat_index.repeat_interleave(heads // g, dim=1).transpose(1, 2)
    return idx.unsqueeze(-1).expand(b, s, heads, dim)


def gather_subsequence(pyramid: list[torch.Tensor], flat_index: torch.Tensor) -> torch.Tensor:
    """Gather rows of the pyramid levels ([B, N / p**l, H, D] each) at `flat_index` -> [B, S, H, D]."""
    flat = torch.cat(pyramid, dim=1)
    _, _, h, d = flat.shape
    return torch.gather(flat, 1, per_head_index(flat_index, h, d))
