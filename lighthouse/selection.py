"""Stage 3: per-tile tree descent that picks which pyramid entries to expand (SPEC section 3).

Every (batch, kv-head) row is cut into T = k / m tiles that select independently (a stratified top-k).
At the coarsest level every entry of a tile is a candidate; at each finer level the candidates are the
p*m children of the tile's m expanded entries. Per level, m/2 candidates are expanded by highest sQ,
then m/2 more by highest sK among the rest; ties go to the lower position. Token 0's chain is always
expanded (it takes one sQ slot in tile 0), which gives every base position an output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import LighthouseConfig
from .inputs import check_config, check_inputs
from .ordering import causal_order, sort_keys
from .scoring import pyramid_scores, token_scores


@dataclass
class Selection:
    """The gathered set of one layer call, in gather (causal) order; each field is [B, G, S].

    level: pyramid level of each entry; index: its index within that level (int64);
    expanded: whether the entry was expanded (its children are gathered too) rather than a leaf.
    """

    level: torch.Tensor
    index: torch.Tensor
    expanded: torch.Tensor


def _top_half(scores: torch.Tensor, half: int) -> torch.Tensor:
    """Positions of the `half` highest scores along the last axis; ties go to the lower position."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :half]


def choose_expanded(sq: torch.Tensor, sk: torch.Tensor, budget: int, force_first: bool) -> torch.Tensor:
    """Mask of the `budget` candidates to expand in each tile; scores are [B, G, T, K] in position order.

    budget/2 go by sQ, then budget/2 by sK among the rest. With `force_first`, candidate 0 of tile 0
    takes one of the sQ slots unconditionally (the prefix guarantee).
    """
    half = budget // 2
    if force_first:
        sq = sq.clone()
        sq[:, :, 0, 0] = float("inf")
    chosen = torch.zeros_like(sq, dtype=torch.bool)
    chosen.scatter_(-1, _top_half(sq, half), True)
    chosen.scatter_(-1, _top_half(sk.masked_fill(chosen, float("-inf")), half), True)
    return chosen


def _split(cand: torch.Tensor, chosen: torch.Tensor, kept: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expanded, leaves) indices of [B, G, T, K] candidates, each kept in ascending position order."""
    chosen_first = torch.sort((~chosen).to(torch.uint8), dim=-1, stable=True).indices
    reordered = cand.gather(-1, chosen_first)
    return reordered[..., :kept], reordered[..., kept:]


def descend(
    sq_levels: list[torch.Tensor], sk_levels: list[torch.Tensor], config: LighthouseConfig, prefix: bool = True
) -> Selection:
    """Run the tree descent on per-level scores ([B, G, N / p**l] each) and return the ordered Selection.

    `prefix` applies the prefix guarantee to tile 0; a sequence shard that does not hold token 0
    (context parallelism) passes False.
    """
    levels, pool, budget = config.levels, config.pool, config.tile_budget
    b, g, n_top = sq_levels[-1].shape
    device = sq_levels[0].device
    parts: list[tuple[int, torch.Tensor, bool]] = []

    if levels == 1:
        parts.append((0, torch.arange(n_top, device=device).expand(b, g, n_top), False))
    else:
        tiles = config.num_tiles
        cand = torch.arange(n_top, device=device).view(1, 1, tiles, n_top // tiles).expand(b, g, -1, -1)
        for lvl in range(levels - 1, -1, -1):
            if lvl < levels - 1:
                children = expanded.unsqueeze(-1) * pool + torch.arange(pool, device=device)
                cand = children.flatten(-2)
            if lvl == 0:
                parts.append((0, cand.flatten(-2), False))
                break
            flat = cand.flatten(-2)
            sq = sq_levels[lvl].gather(-1, flat).view(cand.shape)
            sk = sk_levels[lvl].gather(-1, flat).view(cand.shape)
            chosen = choose_expanded(sq, sk, budget, force_first=prefix)
            expanded, leaves = _split(cand, chosen, budget)
            parts.append((lvl, leaves.flatten(-2), False))
            parts.append((lvl, expanded.flatten(-2), True))

    level = torch.cat([torch.full_like(idx, lvl) for lvl, idx, _ in parts], dim=-1)
    index = torch.cat([idx for _, idx, _ in parts], dim=-1)
    is_exp = torch.cat([torch.full_like(idx, exp, dtype=torch.bool) for _, idx, exp in parts], dim=-1)
    order = causal_order(sort_keys(level, index, is_exp, pool, levels))
    return Selection(level.gather(-1, order), index.gather(-1, order), is_exp.gather(-1, order))


@torch.no_grad()
def select(
    q: torch.Tensor, k: torch.Tensor, config: LighthouseConfig, v: torch.Tensor | None = None, prefix: bool = True
) -> Selection:
    """Select the gathered set for `q [B, N, H, D]`, `k [B, N, G, D]` (v is needed by the dilated scorer).

    `prefix=False` is for a sequence shard that does not hold token 0 (see `descend`). The inputs are checked
    first (`lighthouse.inputs`).
    """
    check_config(config)
    check_inputs(q, k, v, needs_v=False)
    config.validate(q.shape[1])
    if config.scorer == "dilated" and v is None:
        raise ValueError("scorer='dilated' needs v: call select(q, k, config, v=v)")
    sq, sk = (pyramid_scores(s, config.pool, config.levels, config.selection) for s in token_scores(q, k, v, config))
    return descend(sq, sk, config, prefix)
