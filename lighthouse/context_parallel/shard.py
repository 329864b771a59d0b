"""The layer's op on a context-parallel shard: a rank's head and tail chunks, run as a batch of chunks.

Under context parallelism a rank holds two chunks of C tokens laid out
[head, tail] along the sequence. Viewed as [2B, C, heads, D], its q, k, v are a batch of whole chunks
(row 2b + half). Pooling windows and tiles never cross a chunk, so pooling, scores, gather and scatter-back
run on that batch exactly as on 2B sequences of C tokens, with the per-chunk config (topk / 2W). Only the
prefix guarantee tells the chunks apart (it belongs to the chunk holding token 0), so selection runs once
per half, and, with selection="causal" or "strict", the trailing windows of a chunk's first entries, which
reach p**(L-1) - 1 tokens into the previous chunk: the caller's `history` supplies those tokens' level-0 scores.
Scatter-back keeps each chunk's spill for the caller's halo exchange. Both steps are the single-device
layer's own calls, `plan` and `attend` of the implementation the caller passes (`lighthouse.pipeline`), on
the chunk rows.
"""
from __future__ import annotations

import torch

from ..config import LighthouseConfig
from ..pipeline import Pipeline, Plan
from ..scoring import CausalAttention, ScoreHistory
from ..selection import Selection
from .geometry import HEAD, TAIL


def chunk_rows(x: torch.Tensor) -> torch.Tensor:
    """[B, 2C, heads, D] laid out [head, tail] -> [2B, C, heads, D], one chunk per row (row 2b + half)."""
    b, n, heads, d = x.shape
    return x.contiguous().view(2 * b, n // 2, heads, d)


def chunk_scores(s: torch.Tensor) -> torch.Tensor:
    """Token scores [B, G, 2C] of a [head, tail] shard -> [2B, G, C], rows as in `chunk_rows`."""
    b, g, n = s.shape
    return s.view(b, g, 2, n // 2).transpose(1, 2).reshape(2 * b, g, n // 2)


def shard_plan(pipeline: Pipeline, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig,
               prefixes: tuple[bool, bool], token_scores: tuple[torch.Tensor, torch.Tensor] | None = None,
               history: ScoreHistory | None = None) -> Plan:
    """`pipeline.plan` on the chunk rows of a shard (row 2b + half).

    q [B, 2C, H, D], k/v [B, 2C, G, D] hold a head and a tail chunk; `config` is the per-chunk config
    (valid for C tokens). `prefixes[half]` says whether that chunk keeps the prefix guarantee.
    `token_scores`: the shard's level-0 scores (sq, sk [B, G, 2C]) where a chunk's own tokens do not give
    them (the dilated scorer's), else None; pooled per chunk as `config.selection` says (causal, strict: with
    `history`, the scores before each chunk row, needed then).
    """
    if config.trailing_scores and history is None:
        raise ValueError(
            f'selection="{config.selection}" on a shard needs `history`: the scores of the tokens before each chunk'
        )
    rows = None if token_scores is None else tuple(chunk_scores(s) for s in token_scores)
    return pipeline.plan(*(chunk_rows(x) for x in (q, k, v)), config, prefixes, rows, history)


def chunk_selections(plan: Plan, config: LighthouseConfig) -> list[Selection]:
    """The (head, tail) chunks' gathered sets of a `shard_plan`, each [B, G, S_c] in chunk-local coordinates."""
    rows = plan.selection(config)
    return [Selection(rows.level[half::2], rows.index[half::2], rows.expanded[half::2]) for half in (HEAD, TAIL)]


def shard_attention(pipeline: Pipeline, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    config: LighthouseConfig, prefixes: tuple[bool, bool], attention: CausalAttention,
                    token_scores: tuple[torch.Tensor, torch.Tensor] | None = None,
                    history: ScoreHistory | None = None) -> torch.Tensor:
    """The Lighthouse layer on a head/tail shard up to the halo exchange: [B, 2, C + p**(L-1) - 1, H, D].

    Row [b, half] is that chunk's scatter-back with its spill past the chunk's end kept, in float32
    (float64 stays float64): the caller adds the received halos and casts once, as the single-device layer
    casts its sums once. `attention` maps the gathered sequence laid out [head part, tail part]
    (Q~ [B, 2S_c, H, D], K~, V~ [B, 2S_c, G, D]) to O~; context parallelism passes ring attention. The plan
    as `shard_plan` (`token_scores`, `history`); differentiable in q, k, v.
    """
    b = q.shape[0]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    chunks_plan = shard_plan(pipeline, q, k, v, config, prefixes, token_scores, history)

    def shard_sequence_attention(q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor) -> torch.Tensor:
        # chunk rows [2B, S_c, ...] <-> the shard's gathered sequence [B, 2S_c, ...]
        o_t = attention(*(x.view(b, -1, *x.shape[2:]) for x in (q_t, k_t, v_t)))
        return o_t.reshape(q_t.shape)

    qc, kc, vc = (chunk_rows(x) for x in (q, k, v))
    spilled = pipeline.attend(qc, kc, vc, chunks_plan, config, spill=True, attention=shard_sequence_attention,
                              out_dtype=torch.promote_types(q.dtype, torch.float32))
    return spilled.unflatten(0, (b, 2))
