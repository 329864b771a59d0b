"""The stages of the fused Lighthouse layer: the Triton kernels of `lighthouse_kernels/` (through `fused_ops`,
custom ops under torch.compile) composed into the pipeline of `reference.py` (`lighthouse.fused_node` runs them as the
layer; context parallelism composes them per chunk).

`plan` and `attend` are the reference's (`lighthouse.reference.plan`, `attend`: same signatures, same
function, SPEC sections 1-5), so callers pick either through `lighthouse.pipeline.pipeline_for`. Differences
from the reference are float rounding only: per-token norms and pooled means are summed in another order, and
gradients of a token are summed in float32 then cast once (the reference adds its bf16 parts). The selection
itself matches the reference index for index on the same scores. Importing this module imports Triton;
`lighthouse.pipeline` and `lighthouse.layer` import it only where it runs.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch

from .attention import causal_attention
from .config import LighthouseConfig
from .fused_ops import (
    GatherOrder,
    Pyramid,
    causal_score_levels,
    decode,
    gather_pyramid,
    pool_and_score,
    scatter_back,
    select_order,
    stored_levels,
)
from .scoring import CausalAttention, ScoreHistory, pyramid_scores, token_scores
from .selection import Selection

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_HEAD_DIM = 256
MAX_COARSEST_SPAN = 256  # the pooling kernel holds one coarsest window per head in registers


def supports(q: torch.Tensor, config: LighthouseConfig) -> bool:
    """Whether the fused kernels take this call: bf16/fp16/fp32, head dim <= 256 and a coarsest window
    p**(L-1) <= 256 tokens (the device is the caller's concern: CUDA, or Triton's CPU interpreter)."""
    return (
        q.dtype in SUPPORTED_DTYPES
        and q.shape[-1] <= MAX_HEAD_DIM
        and config.coarsest_span <= MAX_COARSEST_SPAN
    )


def check_supported(q: torch.Tensor, config: LighthouseConfig) -> None:
    """Raise ValueError naming the values where `supports(q, config)` is false."""
    if not supports(q, config):
        raise ValueError(
            f"the fused path needs dtype in {SUPPORTED_DTYPES}, head dim <= {MAX_HEAD_DIM} and "
            f"pool**(levels-1) <= {MAX_COARSEST_SPAN}; got dtype={q.dtype}, head dim={q.shape[-1]}, "
            f"pool**(levels-1)={config.coarsest_span}"
        )


def select_gather_order(sq: torch.Tensor, sk: torch.Tensor, seq_len: int, config: LighthouseConfig,
                        prefix: bool = True) -> GatherOrder:
    """The tile kernel's gather order (packed keys [B, G, S]) and its inverse map for `config`, from score
    pyramids sq, sk (float32 [B, G, sum_l N/p^l])."""
    return select_order(sq, sk, seq_len, config.pool, config.levels, config.topk, config.tile_budget, prefix,
                        strict=config.selection == "strict")


def selection_of(packed: torch.Tensor, config: LighthouseConfig) -> Selection:
    """The reference's `Selection` view of packed keys."""
    return Selection(*decode(packed, config.pool, config.levels))


def scores_in_pooling_pass(config: LighthouseConfig) -> bool:
    """Whether the pooling kernel computes the level-0 scores (the norm scorer) or `token_scores` does."""
    return config.scorer == "norm"


def score_pyramid(s: torch.Tensor, config: LighthouseConfig, history: torch.Tensor | None = None) -> torch.Tensor:
    """Level-0 scores [B, G, N] pooled upward as `config.selection` says and laid end to end, level 0 first:
    [B, G, sum_l N/p^l], the layout the selection kernel reads. `history` as in `lighthouse.pyramid_scores`."""
    return torch.cat(pyramid_scores(s, config.pool, config.levels, config.selection, history), dim=-1)


def norm_score_pyramids(pyramid: Pyramid, seq_len: int, config: LighthouseConfig,
                        history: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sq, sk of the pooling pass (window maxima: "paper"), rewritten in place as trailing-window maxima
    for selection="causal" and "strict" (`history`: the level-0 scores of the tokens before each row, as in
    `causal_score_levels`)."""
    if not config.trailing_scores:
        return pyramid.sq, pyramid.sk
    return causal_score_levels(pyramid.sq, pyramid.sk, seq_len, config.pool, config.levels, history)


def pyramid_levels_to_store(seq_len: int, config: LighthouseConfig) -> int:
    """`lighthouse_kernels.pyramid.stored_levels` for `config`: an intermediate level has p * topk gathered entries."""
    return stored_levels(seq_len, config.pool, config.levels, config.pool * config.topk)


class Plan(NamedTuple):
    """What `attend` needs besides q, k, v: their pooled levels (`Pyramid`) and the gather order with its
    inverse map (`GatherOrder`)."""

    pyramid: Pyramid
    order: GatherOrder

    def selection(self, config: LighthouseConfig) -> Selection:
        """The gathered set as the reference's `Selection` (`selection_of` the packed keys)."""
        return selection_of(self.order.packed, config)


@torch.no_grad()
def plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig,
         prefixes: tuple[bool, ...] = (True,), scores: tuple[torch.Tensor, torch.Tensor] | None = None,
         history: ScoreHistory | None = None) -> Plan:
    """Pooling, scores and selection of contiguous rows q [R, N, H, D], k, v [R, N, G, D] for `config`
    (levels >= 2, valid for N); no gradient. Every caller plans through here: the fused layer on one device
    and context parallelism on a shard's chunks (`lighthouse.context_parallel.shard`).

    The norm scorer's level-0 scores come out of the pooling pass; `scores` (sq, sk float32 [R, G, N]) are a
    caller's own (context parallelism rings the dilated scorer's attention), else `lighthouse.token_scores`.
    Rows are `len(prefixes)` interleaved groups: row r keeps the prefix guarantee iff
    `prefixes[r % len(prefixes)]` (a chunk that does not hold token 0 has none). `history`: the scores
    before each row for selection="causal" or "strict" (None: every row starts the sequence).
    """
    n = q.shape[1]
    in_pass = scores is None and scores_in_pooling_pass(config)
    with_history = history is not None and config.trailing_scores
    pyramid = pool_and_score(q, k, v, config.pool, config.levels, scores=in_pass,
                             stored=pyramid_levels_to_store(n, config))
    if in_pass:
        before = history(pyramid.sq[..., :n], pyramid.sk[..., :n]) if with_history else None
        sq, sk = norm_score_pyramids(pyramid, n, config, before)
    else:
        level0 = scores if scores is not None else token_scores(q, k, v, config)
        before = history(*level0) if with_history else (None, None)
        sq, sk = (score_pyramid(s, config, h) for s, h in zip(level0, before))
    groups = len(prefixes)
    if groups == 1:
        return Plan(pyramid, select_gather_order(sq, sk, n, config, prefixes[0]))
    parts = [select_gather_order(sq[i::groups], sk[i::groups], n, config, prefix) for i, prefix in enumerate(prefixes)]
    return Plan(pyramid, GatherOrder(*(torch.stack(group, dim=1).flatten(0, 1) for group in zip(*parts))))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, config: LighthouseConfig,
           spill: bool = False, attention: CausalAttention | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gather, attention and scatter-back of contiguous q, k, v for their `plan`; levels >= 2.

    `attention` maps the gathered Q~ [R, S, H, D], K~, V~ [R, S, G, D] to O~ [R, S, H, D]; by default the
    causal SDPA of `config.backend` (context parallelism passes its ring attention). `spill` keeps the
    p**(L-1)-1 positions past the end (a context-parallel chunk's halo). The output is `out_dtype` (q's
    dtype if None), summed in float32.
    """
    n, pool, levels, order = q.shape[1], config.pool, config.levels, plan.order
    if attention is None:  # not `attention or ...`: Dynamo cannot branch on a function's truth value
        attention = partial(causal_attention, backend=config.backend)
    q_t, k_t, v_t = gather_pyramid(q, k, v, plan.pyramid, order.packed, order.slots, pool, levels)
    return scatter_back(attention(q_t, k_t, v_t), order.slots, n, pool, levels, spill, out_dtype)
