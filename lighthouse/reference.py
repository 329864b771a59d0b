"""The pure-PyTorch pipeline of SPEC sections 1-5, stage by stage; every fast path is tested against it.

`plan` and `attend` have the signatures and meaning of `lighthouse.fused.plan` and `attend`, so a caller
composes either implementation the same way (`lighthouse.pipeline.pipeline_for`): the layer on one device
and context parallelism on a shard's chunk rows.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .attention import causal_attention
from .config import LighthouseConfig
from .gather import gather_subsequence, pyramid_index
from .pyramid import pool_pyramid
from .scatter import scatter_back
from .scoring import CausalAttention, ScoreHistory, pyramid_scores, token_scores
from .selection import Selection, descend


class Plan(NamedTuple):
    """What `attend` needs besides q, k, v: the gathered set of every row, in gather order."""

    selected: Selection

    def selection(self, config: LighthouseConfig) -> Selection:
        """The gathered set, as `lighthouse.fused.Plan.selection` gives it (which decodes with `config`)."""
        return self.selected


def _interleaved(parts: list[Selection]) -> Selection:
    """Selections of the row groups (group i holds rows i, i + len(parts), ...) -> one of all rows in order."""
    fields = zip(*((s.level, s.index, s.expanded) for s in parts))
    return Selection(*(torch.stack(group, dim=1).flatten(0, 1) for group in fields))


@torch.no_grad()
def plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig,
         prefixes: tuple[bool, ...] = (True,), scores: tuple[torch.Tensor, torch.Tensor] | None = None,
         history: ScoreHistory | None = None) -> Plan:
    """Scores and selection of contiguous rows q [R, N, H, D], k, v [R, N, G, D] for `config`; no gradient.

    `scores` (sq, sk [R, G, N]) are a caller's own level-0 scores, else `token_scores`. Rows are
    `len(prefixes)` interleaved groups: row r keeps the prefix guarantee iff `prefixes[r % len(prefixes)]`.
    `history`: the scores before each row for selection="causal" or "strict" (None: every row starts the sequence).
    """
    level0 = scores if scores is not None else token_scores(q, k, v, config)
    before = history(*level0) if history is not None and config.trailing_scores else (None, None)
    sq, sk = (pyramid_scores(s, config.pool, config.levels, config.selection, h) for s, h in zip(level0, before))
    groups = len(prefixes)
    if groups == 1:
        return Plan(descend(sq, sk, config, prefixes[0]))
    parts = [descend([s[i::groups] for s in sq], [s[i::groups] for s in sk], config, prefix)
             for i, prefix in enumerate(prefixes)]
    return Plan(_interleaved(parts))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, config: LighthouseConfig,
           spill: bool = False, attention: CausalAttention | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Pooling, gather, attention and scatter-back of q, k, v for their `plan`, as `lighthouse.fused.attend`.

    `attention` maps the gathered Q~ [R, S, H, D], K~, V~ [R, S, G, D] to O~ (default: the causal SDPA of
    `config.backend`); `spill` keeps the p**(L-1)-1 positions past the end. The output is `out_dtype` (q's
    dtype if None), summed in float32 (float64 stays float64) and cast once.
    """
    n, pool, levels = q.shape[1], config.pool, config.levels
    index = pyramid_index(plan.selected, n, pool, levels)
    q_t, k_t, v_t = (gather_subsequence(pool_pyramid(x, pool, levels), index) for x in (q, k, v))
    if attention is None:
        o_t = causal_attention(q_t, k_t, v_t, config.backend)
    else:
        o_t = attention(q_t, k_t, v_t)
    o = scatter_back(o_t.to(torch.promote_types(o_t.dtype, torch.float32)), index, n, pool, levels, spill)
    return o.to(q.dtype if out_dtype is None else out_dtype)


def reference_lighthouse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig
) -> torch.Tensor:
    """pyramid -> scores -> selection -> order -> gather -> SDPA -> scatter-back on q [B, N, H, D],
    k/v [B, N, G, D] -> o [B, N, H, D]."""
    return attend(q, k, v, plan(q, k, v, config), config)
