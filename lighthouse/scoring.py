"""Stage 2: parameter-free scores of every pyramid entry, as a query (sQ) and as a key (sK) (SPEC section 2).

Scores carry no gradient. Per-token scores are computed per head, then reduced to one score per
key/value head: a query score of group g is the max over the H/G query heads of that group.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .config import LighthouseConfig


def _group_max(s: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, N, H] per-head scores -> [B, G, N]: max over the query heads of each kv group."""
    b, n, h = s.shape
    return s.reshape(b, n, groups, h // groups).amax(dim=-1).transpose(1, 2).contiguous()


@torch.no_grad()
def norm_scores(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sQ(0,j) = ||q_j||, sK(0,j) = ||k_j||, in float32 (float64 stays float64), each [B, G, N]."""
    acc = torch.promote_types(q.dtype, torch.float32)
    groups = k.shape[2]
    sq = torch.linalg.vector_norm(q.to(acc), dim=-1)
    sk = torch.linalg.vector_norm(k.to(acc), dim=-1)
    return _group_max(sq, groups), _group_max(sk, groups)


CausalAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

ScoreHistory = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(sq, sk) level-0 scores of the rows [R, G, N] (float32 on the fused path) -> the level-0 scores of the
p**(L-1) - 1 tokens before each row, [R, G, p**(L-1) - 1] each (-inf before token 0): a row that does not start
the sequence (a context-parallel chunk) under selection="causal" or "strict"."""


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@torch.no_grad()
def dilated_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dilation: int, attention: CausalAttention = _causal_sdpa
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's QK-interaction scorer, O(N^2 D / dilation).

    Level 0 is viewed as `dilation` strided sub-sequences (tokens j, j+dilation, ...). Inside each, causal
    softmax attention runs once as SDPA(q, k, v) and once as SDPA(k, q, v); the L2 norm of each output
    row is sQ(0,j), resp. sK(0,j). With GQA, k and v are repeated to the H query heads for both calls,
    so sK of a kv head is the max over its group's query heads, like sQ. `attention` is the causal
    attention on [B*, H, S, D] (context parallelism passes ring attention).
    """
    acc = torch.promote_types(q.dtype, torch.float32)
    b, n, h, d = q.shape
    groups = k.shape[2]
    rep = h // groups

    def strided(x: torch.Tensor) -> torch.Tensor:
        # [B, N, H, D] -> [B * dilation, H, N / dilation, D]; row r holds tokens r, r + dilation, ...
        x = x.to(acc).repeat_interleave(rep, dim=2) if x.shape[2] != h else x.to(acc)
        return (x.reshape(b, n // dilation, dilation, h, d).permute(0, 2, 3, 1, 4)
                .reshape(b * dilation, h, n // dilation, d))

    def unstrided_norm(o: torch.Tensor) -> torch.Tensor:
        # [B * dilation, H, N / dilation, D] -> row norms [B, N, H]
        o = o.reshape(b, dilation, h, n // dilation, d).permute(0, 3, 1, 2, 4).reshape(b, n, h, d)
        return torch.linalg.vector_norm(o, dim=-1)

    qs, ks, vs = strided(q), strided(k), strided(v)
    sq = unstrided_norm(attention(qs, ks, vs))
    sk = unstrided_norm(attention(ks, qs, vs))
    return _group_max(sq, groups), _group_max(sk, groups)


def token_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig,
    attention: CausalAttention = _causal_sdpa,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Level-0 scores [B, G, N] with the configured scorer: the one place a scorer is chosen (add a new one
    here and to `config_rules.SCORERS`). `attention` is the dilated scorer's causal attention."""
    if config.scorer == "dilated":
        return dilated_scores(q, k, v, config.dilation, attention)
    return norm_scores(q, k)


@torch.no_grad()
def pyramid_scores(
    s: torch.Tensor, pool: int, levels: int, selection: str = "paper", history: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Level-0 scores [B, G, N] pooled upward: level l is [B, G, N / pool**l] (SPEC sections 2 and 3).

    "paper": entry i of level l scores the max over its window [i*c, (i+1)*c - 1], c = pool**l.
    "causal" (and "strict"): the max over the c tokens ending at its first token, [i*c - c + 1, i*c], clipped at
    the start of the sequence. `history` [B, G, pool**(levels-1) - 1] holds the level-0 scores of the tokens right
    before `s` (a sequence shard that does not start at token 0); None means `s` starts the sequence.
    """
    b, g, n = s.shape
    if selection == "paper":
        return [s if lvl == 0 else s.reshape(b, g, n // pool**lvl, pool**lvl).amax(dim=-1) for lvl in range(levels)]
    halo = pool ** (levels - 1) - 1
    if history is None:
        history = s.new_full((b, g, halo), float("-inf"))
    elif history.shape != (b, g, halo):
        raise ValueError(f"history{tuple(history.shape)} must be [B, G, pool**(levels-1) - 1] = {(b, g, halo)}")
    extended = torch.cat([history, s], dim=-1)  # token t at extended[halo + t]
    out = [s]
    for lvl in range(1, levels):
        span = pool**lvl
        # trailing[i*span + j] = token i*span - span + 1 + j
        trailing = extended[..., halo + 1 - span : halo + 1 - span + n]
        out.append(trailing.reshape(b, g, n // span, span).amax(dim=-1))
    return out
