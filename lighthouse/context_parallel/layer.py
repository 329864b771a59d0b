"""The context-parallel Lighthouse layer: the single-device layer, computed on a rank's head/tail shards.

Why this is exact (SPEC section 6): tiles never cross a chunk (T = topk/tile_budget is a multiple of 2W), and
tiles select independently, so each chunk selects on its own tokens with topk / 2W. Every tile gathers the
same number of entries and the sort key is monotone in position, so the single-device gathered sequence is
the concatenation of the chunks' gathered parts in chunk order: laid out [head part, tail part], it is
sharded exactly like the dense sequence and goes through torch's stock ring attention (causal, load
balanced). Scatter-back ranges spill up to pool**(levels-1) - 1 positions into the next chunk; that halo is
sent to the chunk's owner (`halos.FoldHalos`). The prefix guarantee applies to chunk 0 only (global token 0).
With selection="causal" an entry scores the p**l tokens ending at its first token, so a chunk's first entries
reach up to p**(L-1) - 1 tokens into the previous chunk: each rank all-gathers the level-0 scores of its
chunks' last p**(L-1) - 1 tokens (`halos.score_histories`), the same owner map as the output halos, and
every chunk pools with the exact scores the single device sees.
The dilated scorer attends over strided sub-sequences of the whole sequence; with chunks divisible by the
dilation those are sharded head/tail too, so its attention also runs as ring attention.

Per chunk, the stages run as the single-device layer does: the fused Triton kernels where
`lighthouse.layer.resolve_implementation` says so (`fused.py`), else the pure-PyTorch pipeline.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh

from ..attention import resolve_backend
from ..config import LighthouseConfig
from ..gather import gather_subsequence, pyramid_index
from ..layer import LighthouseAttention, check_inputs, resolve_implementation
from ..pyramid import pool_pyramid
from ..scatter import scatter_back
from ..scoring import pyramid_scores, token_scores
from ..selection import Selection, descend
from .geometry import HEAD, TAIL, check_context_parallel, chunk_config, prefixes
from .halos import FoldHalos, score_histories
from .ring import ring_causal_attention, ring_scorer_attention


def _prefixes(mesh: DeviceMesh) -> tuple[bool, bool]:
    return prefixes(mesh.get_local_rank(), mesh.size())


def shard_token_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> tuple[torch.Tensor, torch.Tensor]:
    """Level-0 scores sq, sk [B, G, 2C] of this rank's shard; the dilated scorer's attention rings over the
    whole sequence."""
    return token_scores(q, k, v, config, ring_scorer_attention(mesh))


def shard_selections(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> list[Selection]:
    """Selections of this rank's (head, tail) chunks, each in chunk-local coordinates, in gather order.

    q [B, 2C, H, D], k/v [B, 2C, G, D] are the rank's head and tail chunks of length C. Scores are per token
    (`shard_token_scores`); each chunk then descends on its own tiles with `chunk_config`, and only chunk 0
    applies the prefix guarantee.
    """
    chunk_len, local = q.shape[1] // 2, chunk_config(config, mesh.size())
    scores = torch.stack(shard_token_scores(q, k, v, config, mesh))  # [sq/sk, B, G, 2C]
    chunks = scores.unflatten(-1, (2, chunk_len)).transpose(0, 3)  # [half, B, G, sq/sk, C]
    before = _chunk_histories(chunks, config, mesh)
    selections = []
    for half, prefix in enumerate(_prefixes(mesh)):
        sq_levels, sk_levels = (
            pyramid_scores(chunks[half, :, :, i], config.pool, config.levels, config.selection,
                           None if before is None else before[half, :, :, i])
            for i in range(2)
        )
        selections.append(descend(sq_levels, sk_levels, local, prefix=prefix))
    return selections


def _chunk_histories(chunks: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh) -> torch.Tensor | None:
    """Level-0 scores [2, ..., p**(L-1) - 1] before each owned chunk of `chunks` [2 (half), ..., C] for
    selection="causal" (`score_histories`); None for "paper", which reads no token outside the chunk."""
    if config.selection == "paper":
        return None
    halo = config.coarsest_span - 1
    return score_histories(chunks[..., chunks.shape[-1] - halo:], mesh.get_group())


def _fused_history(config: LighthouseConfig, mesh: DeviceMesh):
    """`lighthouse.fused.ScoreHistory` of this rank: chunk rows [2B, G, C] (row 2b + half) in, histories out."""

    def history(sq: torch.Tensor, sk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, g, chunk_len = sq.shape
        chunks = torch.stack((sq, sk), dim=2).view(rows // 2, 2, g, 2, chunk_len).transpose(0, 1)
        before = _chunk_histories(chunks, config, mesh).transpose(0, 1).reshape(rows, g, 2, -1)
        return before[:, :, 0].contiguous(), before[:, :, 1].contiguous()

    return history


def _fused_token_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Level-0 scores for `fused.shard_plan`: None where the pooling kernel computes them (norm scorer)."""
    from ..fused import scores_in_pooling_pass

    return None if scores_in_pooling_pass(config) else shard_token_scores(q, k, v, config, mesh)


@torch.no_grad()
def fused_shard_selections(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> list[Selection]:
    """`shard_selections` computed by the fused kernels (`fused.shard_plan`): what the fused CP layer gathers."""
    from ..fused import selection_of
    from .fused import shard_plan

    local = chunk_config(config, mesh.size())
    _, order = shard_plan(q, k, v, local, _prefixes(mesh), _fused_token_scores(q, k, v, config, mesh),
                          _fused_history(config, mesh))
    return [selection_of(order.packed[half::2], local) for half in (HEAD, TAIL)]


def _gather_chunks(x: torch.Tensor, flat_index: list[torch.Tensor], pool: int, levels: int) -> torch.Tensor:
    """The gathered sub-sequences of x's head and tail chunks, laid out [head part, tail part]."""
    parts = [gather_subsequence(pool_pyramid(c, pool, levels), idx) for c, idx in zip(x.chunk(2, dim=1), flat_index)]
    return torch.cat(parts, dim=1)


def reference_shard_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> torch.Tensor:
    """The CP layer with the pure-PyTorch pipeline per chunk (levels >= 2; inputs checked by the caller).

    Scatter-back sums in float32 and casts once after the halos are added, as the single-device reference.
    """
    pool, levels, chunk_len = config.pool, config.levels, q.shape[1] // 2
    flat_index = [pyramid_index(sel, chunk_len, pool, levels) for sel in shard_selections(q, k, v, config, mesh)]
    q_t, k_t, v_t = (_gather_chunks(x, flat_index, pool, levels) for x in (q, k, v))
    o_t = ring_causal_attention(q_t, k_t, v_t, mesh, config.backend)
    acc = torch.promote_types(o_t.dtype, torch.float32)
    spilled = torch.stack(
        [scatter_back(part.to(acc), idx, chunk_len, pool, levels, spill=True)
         for part, idx in zip(o_t.chunk(2, 1), flat_index)],
        dim=1,
    )
    return FoldHalos.apply(spilled, chunk_len, q.dtype, mesh.get_group())


def fused_shard_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> torch.Tensor:
    """The CP layer with the fused kernels per chunk (`fused.shard_attention`; levels >= 2, inputs checked by
    the caller, Triton on CUDA or in its CPU interpreter).

    The scatter kernel keeps each chunk's float32 sums; the received halos are added to them and the
    result is cast once, as in the single-device layer.
    """
    from .fused import shard_attention

    spilled = shard_attention(
        q, k, v, chunk_config(config, mesh.size()), _prefixes(mesh),
        lambda *gathered: ring_causal_attention(*gathered, mesh, config.backend),
        _fused_token_scores(q, k, v, config, mesh), _fused_history(config, mesh),
    )
    return FoldHalos.apply(spilled, q.shape[1] // 2, q.dtype, mesh.get_group())


def context_parallel_lighthouse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> torch.Tensor:
    """Lighthouse attention on this rank's head/tail shards: q [B, 2C, H, D], k/v [B, 2C, G, D] -> o [B, 2C, H, D].

    Equals the matching rows of the single-device `lighthouse_attention` on the whole sequence (same tiles,
    same selection), forward and backward. `mesh` is the 1-D context-parallel mesh. The fused kernels run
    where the single-device layer would run them (`resolve_implementation`), else the reference pipeline.
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
    if resolve_implementation(q, config) == "fused":
        return fused_shard_attention(q, k, v, config, mesh)
    return reference_shard_attention(q, k, v, config, mesh)


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
