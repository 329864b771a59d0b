"""Stage 3: per-tile tree descent that picks which pyramid entries to expand (SPEC section 3).

Every (batch, kv-head) row is cut into T = k / m tiles that select independently (a stratified top-k).
At the coarsest level every entry of a tile is a candidate; at each finer level the candidates are the
p*m children of the tile's m expanded entries. Per level, m/2 candidates are expanded by highest sQ,
then m/2 more by highest sK among the rest; ties go to the lower position. Token 0's chain is always
expanded (it takes one sQ slot in tile 0), which gives every base position an output.

selection="strict" replaces the ranking with an online rule (SPEC section 3a): a candidate's fate depends
only on the candidates before it in its tile, so no decision reads a token after the candidate's first.
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


def _previous_max(scores: torch.Tensor, window: int) -> torch.Tensor:
    """Max of the `window` scores before each position along the last axis (-inf where there are none)."""
    padded = torch.nn.functional.pad(scores, (window, 0), value=float("-inf"))
    return padded.unfold(-1, window, 1)[..., : scores.shape[-1], :].amax(dim=-1)


def _first_under(flags: torch.Tensor, cap: int) -> torch.Tensor:
    """`flags` kept only where fewer than `cap` flags come before it along the last axis."""
    counts = flags.to(torch.int64)
    return flags & (counts.cumsum(-1) - counts < cap)


def online_window(candidates: int, budget: int) -> int:
    """How many earlier candidates a strict candidate must outscore: 2K/m - 1, so that about m/2 of K
    candidates with independent scores are records of each score (at least 1, as K >= m)."""
    return 2 * candidates // budget - 1


def _records(scores: torch.Tensor, window: int) -> torch.Tensor:
    """Candidates that score strictly above each of the `window` candidates before them (NaN counts as +inf);
    the first candidate of a tile always is one."""
    scores = torch.where(scores.isnan(), float("inf"), scores)
    records = scores > _previous_max(scores, window)
    records[..., 0] = True
    return records


def choose_expanded_online(sq: torch.Tensor, sk: torch.Tensor, budget: int) -> torch.Tensor:
    """selection="strict": mask of the `budget` candidates to expand in each tile, [B, G, T, K] scores in
    position order, each decision a function of the candidates up to it (SPEC section 3a).

    The first budget/2 sQ records (`online_window`) are expanded, then the first budget/2 sK records among
    the rest; once the candidates left are no more than the budget left, every one is. A tile's first
    candidate is always an sQ record, so token 0's chain is expanded without forcing (the prefix guarantee).
    """
    cands = sq.shape[-1]
    window = online_window(cands, budget)
    by_q = _first_under(_records(sq, window), budget // 2)
    by_k = _first_under(_records(sk, window) & ~by_q, budget // 2)
    picked = by_q | by_k
    before = picked.to(torch.int64).cumsum(-1) - picked.to(torch.int64)
    left = cands - torch.arange(cands, device=sq.device)
    return picked | (before + left <= budget)


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
            if config.selection == "strict":
                chosen = choose_expanded_online(sq, sk, budget)
            else:
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
