"""The context-parallel Lighthouse layer: the single-device layer, computed on a rank's head/tail shards.

Why this is exact (SPEC section 6): tiles never cross a chunk (T = topk/tile_budget is a multiple of 2W), and
tiles select independently, so each chunk selects on its own tokens with topk / 2W. Every tile gathers the
same number of entries and the sort key is monotone in position, so the single-device gathered sequence is
the concatenation of the chunks' gathered parts in chunk order: laid out [head part, tail part], it is
sharded exactly like the dense sequence and goes through torch's stock ring attention (causal, load
balanced). Scatter-back ranges spill up to pool**(levels-1) - 1 positions into the next chunk; that halo is
sent to the chunk's owner (`halos.FoldHalos`). The prefix guarantee applies to chunk 0 only (global token 0).
With selection="causal" or "strict" an entry scores the p**l tokens ending at its first token, so a chunk's
first entries reach up to p**(L-1) - 1 tokens into the previous chunk (strict's online rule reads nothing else
outside its tile): each rank all-gathers the level-0 scores of its
chunks' last p**(L-1) - 1 tokens (`halos.score_histories`), the same owner map as the output halos, and
every chunk pools with the exact scores the single device sees.
The dilated scorer attends over strided sub-sequences of the whole sequence; with chunks divisible by the
dilation those are sharded head/tail too, so its attention also runs as ring attention.

Per chunk, the stages run as the single-device layer does, on the implementation `lighthouse.pipeline.pipeline_for`
picks (the fused Triton kernels or the pure-PyTorch reference), composed one way for both (`shard.py`).
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from ..attention import resolve_backend
from ..config import LighthouseConfig
from ..layer import LighthouseAttention, check_inputs
from ..pipeline import pipeline_for
from ..scoring import ScoreHistory, token_scores
from ..selection import Selection
from .geometry import check_context_parallel, chunk_config, prefixes
from .halos import FoldHalos, score_histories
from .ring import ring_causal_attention, ring_scorer_attention
from .shard import chunk_selections, shard_attention, shard_plan


def _prefixes(mesh: DeviceMesh) -> tuple[bool, bool]:
    return prefixes(mesh.get_local_rank(), mesh.size())


def shard_token_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Level-0 scores sq, sk [B, G, 2C] of this rank's shard where a chunk's own tokens do not give them: the
    dilated scorer attends over the whole sequence, so its attention rings. None for the norm scorer, whose
    per-token scores each implementation's `plan` computes on the chunks (the fused one in its pooling pass)."""
    if config.scorer == "norm":
        return None
    return token_scores(q, k, v, config, ring_scorer_attention(mesh))


def shard_score_history(config: LighthouseConfig, mesh: DeviceMesh) -> ScoreHistory | None:
    """This rank's `ScoreHistory` for selection="causal" or "strict": chunk rows [2B, G, C] (row 2b + half) in,
    the level-0 scores of the p**(L-1) - 1 tokens before each chunk out (`halos.score_histories`, one all-gather:
    the same owner map as the output halos). None for "paper", which reads no token outside the chunk."""
    if not config.trailing_scores:
        return None
    halo = config.coarsest_span - 1

    def history(sq: torch.Tensor, sk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, g, chunk_len = sq.shape
        tails = torch.stack((sq, sk), dim=2)[..., chunk_len - halo:].view(rows // 2, 2, g, 2, halo).transpose(0, 1)
        before = score_histories(tails, mesh.get_group()).transpose(0, 1).reshape(rows, g, 2, halo)
        return before[:, :, 0].contiguous(), before[:, :, 1].contiguous()

    return history


@torch.no_grad()
def shard_selections(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> list[Selection]:
    """Selections of this rank's (head, tail) chunks, each in chunk-local coordinates, in gather order: what
    the CP layer gathers, planned by the implementation it runs (`pipeline_for`).

    q [B, 2C, H, D], k/v [B, 2C, G, D] are the rank's head and tail chunks of length C; each chunk selects on
    its own tiles with `chunk_config`, and only chunk 0 applies the prefix guarantee. Every CP rank must call
    it (collectives).
    """
    local = chunk_config(config, mesh.size())
    chunks_plan = shard_plan(pipeline_for(q, config), q, k, v, local, _prefixes(mesh),
                             shard_token_scores(q, k, v, config, mesh), shard_score_history(config, mesh))
    return chunk_selections(chunks_plan, local)


def context_parallel_lighthouse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> torch.Tensor:
    """Lighthouse attention on this rank's head/tail shards: q [B, 2C, H, D], k/v [B, 2C, G, D] -> o [B, 2C, H, D].

    Equals the matching rows of the single-device `lighthouse_attention` on the whole sequence (same tiles,
    same selection), forward and backward. `mesh` is the 1-D context-parallel mesh. The implementation is the
    one the single-device layer would run (`lighthouse.pipeline.pipeline_for`), through `shard.shard_attention`
    with ring attention; the received halos are added to its sums (`halos.FoldHalos`), then cast once.
    """
    check_inputs(q, k, v)
    if mesh.ndim != 1:
        raise ValueError(f"the context-parallel mesh must be 1-D; got a {mesh.ndim}-D mesh {mesh}")
    cp_degree, local_len = mesh.size(), q.shape[1]
    if local_len % 2 != 0:
        raise ValueError(f"the local sequence of {local_len} tokens is not a head and a tail chunk of equal length")
    check_context_parallel(config, local_len * cp_degree, cp_degree)
    if config.levels == 1:
        return ring_causal_attention(q, k, v, mesh, config.backend)
    spilled = shard_attention(
        pipeline_for(q, config), q, k, v, chunk_config(config, cp_degree), _prefixes(mesh),
        lambda *gathered: ring_causal_attention(*gathered, mesh, config.backend),
        shard_token_scores(q, k, v, config, mesh), shard_score_history(config, mesh),
    )
    return FoldHalos.apply(spilled, local_len // 2, q.dtype, mesh.get_group())


class ContextParallelLighthouseAttention(LighthouseAttention):
    """`LighthouseAttention` on a sequence sharded head/tail over a 1-D context-parallel mesh; no parameters.

    forward(q, k, v) takes and returns this rank's shards in the [B, N_local, heads, D] layout.
    """

    def __init__(self, config: LighthouseConfig, mesh: DeviceMesh) -> None:
        super().__init__(config)
        resolve_backend(config.backend, torch.device(mesh.device_type), torch.bfloat16, ring=True)
        self.mesh = mesh

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return context_parallel_lighthouse_attention(q, k, v, self.config, self.mesh)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, cp_degree={self.mesh.size()}"
