"""Stage 3b: the causal order of the gathered sub-sequence, as exact int64 sort keys (SPEC section 4)."""
from __future__ import annotations

import torch


def sort_keys(level: torch.Tensor, index: torch.Tensor, expanded: torch.Tensor, pool: int, levels: int) -> torch.Tensor:
    """int64 key of each entry: a leaf sorts at start*(L+1), an expanded entry at end*(L+1) + level.

    An expanded entry thus comes right after its own last token and before the next leaf, finer
    expanded entries first; keys are unique, so the order is total and exact.
    """
    span = torch.pow(pool, level)
    start = index * span
    end = start + span - 1
    return torch.where(expanded, end * (levels + 1) + level, start * (levels + 1))


def causal_order(keys: torch.Tensor) -> torch.Tensor:
    """Permutation along the last axis that sorts entries by key."""
    return torch.argsort(keys, dim=-1)
