"""Context parallelism for Lighthouse layers: the single-device layer, computed on sequence shards.

Layout (torchtitan's head/tail load balancing): with CP degree W the sequence is cut into 2W equal chunks
and rank r holds chunks r and 2W-1-r, concatenated as [head, tail] along the sequence axis.

Why this is exact (SPEC section 6): tiles never cross a chunk (T = topk/tile_budget is a multiple of 2W), and
tiles select independently, so each chunk selects on its own tokens with topk / 2W. Every tile gathers the
same number of entries and the sort key is monotone in position, so the single-device gathered sequence is
the concatenation of the chunks' gathered parts in chunk order: laid out [head part, tail part], it is
sharded exactly like the dense sequence and goes through torch's stock ring attention (causal, load
balanced). Scatter-back ranges spill up to pool**(levels-1) - 1 positions into the next chunk; that halo is
sent to the chunk's owner (`FoldHalos`). The prefix guarantee applies to chunk 0 only (global token 0).
With selection="causal" an entry scores the p**l tokens ending at its first token, so a chunk's first entries
reach up to p**(L-1) - 1 tokens into the previous chunk: each rank all-gathers the level-0 scores of its
chunks' last p**(L-1) - 1 tokens (`score_histories`), the same owner map as the output halos, and every
chunk pools with the exact scores the single device sees.
The dilated scorer attends over strided sub-sequences of the whole sequence; with chunks divisible by the
dilation those are sharded head/tail too, so its attention also runs as ring attention.

Per chunk, the stages run as the single-device layer does: the fused Triton kernels where
`lighthouse.layer.uses_fused_kernels` says so (`kernels.shard`), else the pure-PyTorch pipeline.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental._attention import _cp_options, _enable_context_parallel_dispatcher
from torch.nn.attention import sdpa_kernel

from .attention import SDPA_BACKENDS
from .config import LighthouseConfig
from .gather import gather_subsequence, pyramid_index
from .layer import LighthouseAttention, check_inputs, uses_fused_kernels
from .pyramid import pool_pyramid
from .scatter import scatter_back
from .scoring import dilated_scores, norm_scores, pyramid_scores
from .selection import Selection, descend

RING_BACKENDS = ("cudnn", "flash", "efficient")
"""SDPA backends torch's context-parallel dispatcher rings (the math backend has no ring rule)."""


_RING_OPS = {
    "cpu": torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    "cuda": torch.ops.aten._scaled_dot_product_flash_attention.default,
}


HEAD, TAIL = 0, 1
Slot = tuple[int, int]  # (rank, HEAD or TAIL): one owned chunk


def owned_chunks(rank: int, cp_degree: int) -> tuple[int, int]:
    """(head, tail) chunk indices of `rank`: chunks r and 2W-1-r of the 2W equal chunks."""
    return rank, 2 * cp_degree - 1 - rank


def check_context_parallel(config: LighthouseConfig, seq_len: int, cp_degree: int) -> None:
    """Raise ValueError naming the values if `config` cannot run on `seq_len` tokens split over `cp_degree` ranks.

    Degree 1 still means two chunks (a one-rank ring, as in the tests); a job without CP checks
    `config.validate(seq_len)` instead.
    """
    if cp_degree < 1:
        raise ValueError(f"context_parallel_degree={cp_degree} must be >= 1")
    config.validate(seq_len)
    chunks = 2 * cp_degree
    if seq_len % chunks != 0:
        raise ValueError(
            f"seq_len={seq_len} does not split into 2*context_parallel_degree={chunks} equal chunks "
            f"(context_parallel_degree={cp_degree})"
        )
    if config.levels == 1:
        return
    if config.num_tiles % chunks != 0:
        raise ValueError(
            f"topk/tile_budget={config.num_tiles} tiles (topk={config.topk}, tile_budget={config.tile_budget}) do "
            f"not split evenly over the 2*context_parallel_degree={chunks} chunks of seq_len={seq_len} "
            f"(context_parallel_degree={cp_degree}); a tile may not cross a chunk: make topk/tile_budget a multiple "
            f"of {chunks}"
        )
    # Whole tiles per chunk, hence whole coarsest entries: pooling windows never cross a chunk either.
    chunk_len = seq_len // chunks
    if config.scorer == "dilated" and chunk_len % config.dilation != 0:
        raise ValueError(
            f"chunk length seq_len/(2*context_parallel_degree)={chunk_len} (seq_len={seq_len}, "
            f"context_parallel_degree={cp_degree}) is not divisible by dilation={config.dilation}"
        )


def chunk_config(config: LighthouseConfig, cp_degree: int) -> LighthouseConfig:
    """The config one chunk selects with: topk / (2W), same tile budget, hence the same tiles."""
    return dataclasses.replace(config, topk=config.topk // (2 * cp_degree))


def offset_selection(selection: Selection, chunk: int, chunk_len: int, pool: int) -> Selection:
    """A chunk's selection in global coordinates: level-l indices shifted by the chunk's start // pool**l."""
    start = chunk * chunk_len
    return Selection(selection.level, selection.index + start // pool**selection.level, selection.expanded)


def ring_backend(backend: str, device: torch.device) -> str:
    """The SDPA backend ring attention runs with: 'auto'/'reference' mean cuDNN on CUDA, flash on CPU."""
    if backend in ("auto", "reference"):
        return "cudnn" if device.type == "cuda" else "flash"
    if backend not in RING_BACKENDS:
        raise ValueError(
            f"backend={backend!r} has no ring attention under context parallelism; use 'auto' or one of {RING_BACKENDS}"
        )
    return backend


def enable_ring_dispatch(device_type: str) -> None:
    """Turn on torch's context-parallel SDPA dispatcher (idempotent); it must stay on through backward."""
    op = _RING_OPS.get(device_type)
    if op is None:
        raise ValueError(
            f"ring attention has no rule for device type {device_type!r}; expected one of {tuple(_RING_OPS)}"
        )
    _enable_context_parallel_dispatcher()
    if op not in DTensor._op_dispatcher._custom_op_handlers:
        raise RuntimeError(
            f"torch's context-parallel dispatcher has no rule for {op}: on CPU call "
            "recipe.context_parallel.register_cpu_ring_attention() first"
        )


def _check_head_tail_layout() -> None:
    if not _cp_options.enable_load_balance:
        raise ValueError(
            "Lighthouse context parallelism needs the head/tail sequence layout, but torch's ring attention is set "
            "to no load balancing (torchtitan: parallelism.context_parallel_load_balancer must be 'headtail')"
        )


def ring_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mesh: DeviceMesh, backend: str = "auto"
) -> torch.Tensor:
    """Causal SDPA over a sequence sharded head/tail on `mesh`: local q [B, S, H, D], k/v [B, S, G, D] -> [B, S, H, D].

    The local tensors are wrapped as DTensors sharded on the sequence dim, so torch's context-parallel
    dispatcher runs its ring attention (rotation set by `set_rotate_method`); scale 1/sqrt(D).
    """
    name = ring_backend(backend, q.device)
    enable_ring_dispatch(q.device.type)
    _check_head_tail_layout()
    heads = q.shape[2]
    if k.shape[2] != heads and name != "flash":
        k, v = (x.repeat_interleave(heads // k.shape[2], dim=2) for x in (k, v))
    qd, kd, vd = (DTensor.from_local(x.transpose(1, 2), mesh, [Shard(2)], run_check=False) for x in (q, k, v))
    with sdpa_kernel(SDPA_BACKENDS[name]):
        out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=kd.shape[1] != heads)
    return out.to_local().transpose(1, 2)


def _ring_scorer_attention(mesh: DeviceMesh, device: torch.device):
    """Causal ring attention on [B*, H, S, D] for the dilated scorer's two attentions.

    The scorer works in float32, so on CUDA the ring uses the efficient kernel (flash and cuDNN take 16-bit
    inputs only).
    """
    backend = "efficient" if device.type == "cuda" else "flash"

    def ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        return ring_causal_attention(q, k, v, mesh, backend).transpose(1, 2)

    return ring


def shard_token_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> tuple[torch.Tensor, torch.Tensor]:
    """Level-0 scores sq, sk [B, G, 2C] of this rank's shard; the dilated scorer's attention rings over the
    whole sequence."""
    if config.scorer == "dilated":
        return dilated_scores(q, k, v, config.dilation, _ring_scorer_attention(mesh, q.device))
    return norm_scores(q, k)


def _prefixes(mesh: DeviceMesh) -> tuple[bool, bool]:
    """Whether this rank's head, resp. tail, chunk keeps the prefix guarantee: only chunk 0 (global token 0)."""
    return tuple(chunk == 0 for chunk in owned_chunks(mesh.get_local_rank(), mesh.size()))


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
    """`kernels.shard.ScoreHistory` of this rank: chunk rows [2B, G, C] (row 2b + half) in, histories out."""

    def history(sq: torch.Tensor, sk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, g, chunk_len = sq.shape
        chunks = torch.stack((sq, sk), dim=2).view(rows // 2, 2, g, 2, chunk_len).transpose(0, 1)
        before = _chunk_histories(chunks, config, mesh).transpose(0, 1).reshape(rows, g, 2, -1)
        return before[:, :, 0].contiguous(), before[:, :, 1].contiguous()

    return history


def _fused_token_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Level-0 scores for `kernels.shard`: None for the norm scorer (the pooling kernel takes them)."""
    return shard_token_scores(q, k, v, config, mesh) if config.scorer == "dilated" else None


@torch.no_grad()
def fused_shard_selections(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig, mesh: DeviceMesh
) -> list[Selection]:
    """`shard_selections` computed by the fused kernels (`kernels.shard.select_shard`): what the fused CP layer
    gathers."""
    from kernels.selection import selection_of
    from kernels.shard import select_shard

    local = chunk_config(config, mesh.size())
    _, packed = select_shard(q, k, v, local, _prefixes(mesh), _fused_token_scores(q, k, v, config, mesh),
                             _fused_history(config, mesh))
    return [selection_of(packed[half::2], local) for half in (HEAD, TAIL)]


def all_gather_stacked(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[W, *x.shape]: every rank's `x` (gloo and NCCL)."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.stack(parts)


def halo_sources(rank: int, cp_degree: int) -> tuple[Slot | None, Slot]:
    """The chunks whose halos land on this rank's head chunk, resp. its tail chunk (chunk c sends to c+1).

    Head chunk r receives from chunk r-1, rank r-1's head (nothing for chunk 0). Tail chunk 2W-1-r
    receives from chunk 2W-2-r: rank r+1's tail, or for the middle rank W-1 its own head (chunk W-1).
    """
    into_head = (rank - 1, HEAD) if rank > 0 else None
    into_tail = (rank + 1, TAIL) if rank + 1 < cp_degree else (rank, HEAD)
    return into_head, into_tail


def halo_destinations(rank: int, cp_degree: int) -> tuple[Slot, Slot | None]:
    """The chunks this rank's head halo, resp. tail halo, lands on: the inverse of `halo_sources`.

    Rank 0's tail is the last chunk: its halo reaches past the sequence and is dropped.
    """
    head_to = (rank + 1, HEAD) if rank + 1 < cp_degree else (rank, TAIL)
    tail_to = (rank - 1, TAIL) if rank > 0 else None
    return head_to, tail_to


def _pick(per_rank: torch.Tensor, slot: Slot | None, like: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """per_rank[rank, HEAD/TAIL] of an all-gathered [W, 2, ...] tensor; `fill` where `slot` is None."""
    return per_rank[slot] if slot is not None else torch.full_like(like, fill)


def score_histories(tails: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The level-0 scores before each owned chunk, from every rank's chunk tails (one all-gather).

    tails [2, ...]: this rank's head and tail chunks' last p**(L-1) - 1 level-0 scores. Returns [2, ...]:
    those of the chunk before each (chunk c reads chunk c-1, the halo map), -inf before chunk 0.
    """
    rank, cp_degree = dist.get_rank(group), dist.get_world_size(group)
    sent = all_gather_stacked(tails, group)
    return torch.stack([_pick(sent, src, tails[0], float("-inf")) for src in halo_sources(rank, cp_degree)])


class FoldHalos(torch.autograd.Function):
    """Per-chunk scatter-backs with spill [B, 2, C + h, H, D] -> this rank's output [B, 2C, H, D] in `dtype`.

    Each owned chunk's spill (its last h rows) goes to the owner of the next chunk, which adds it to its
    first h positions before the one cast to `dtype` (zeros before chunk 0; the last chunk's spill is
    dropped, as on one device). backward returns to each sender the gradient of the positions its halo was
    added to. One all-gather of the small halos each way (gloo and NCCL); one pass over the output each way.
    """

    @staticmethod
    def forward(ctx, spilled: torch.Tensor, chunk_len: int, dtype: torch.dtype, group: dist.ProcessGroup):
        rank, cp_degree = dist.get_rank(group), dist.get_world_size(group)
        width = spilled.shape[2] - chunk_len
        spills = spilled[:, :, chunk_len:].transpose(0, 1)  # [2, B, h, H, D]
        sent = all_gather_stacked(spills, group)
        halo = torch.stack([_pick(sent, src, spills[0]) for src in halo_sources(rank, cp_degree)], dim=1)
        out = spilled[:, :, :chunk_len].to(dtype, copy=True)
        out[:, :, :width] = spilled[:, :, :width] + halo
        ctx.meta = (group, width, spilled.dtype)
        return out.flatten(1, 2)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        group, width, acc = ctx.meta
        rank, cp_degree = dist.get_rank(group), dist.get_world_size(group)
        b, n, *rest = grad_out.shape
        grad_out = grad_out.reshape(b, 2, n // 2, *rest)
        heads = grad_out[:, :, :width].transpose(0, 1)  # [2, B, h, H, D]: the halos' gradients
        received = all_gather_stacked(heads, group)
        grad = grad_out.new_empty(b, 2, n // 2 + width, *rest, dtype=acc)
        grad[:, :, : n // 2] = grad_out
        grad[:, :, n // 2:] = torch.stack(
            [_pick(received, dst, heads[0]) for dst in halo_destinations(rank, cp_degree)], dim=1
        )
        return grad, None, None, None


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
    """The CP layer with the fused kernels per chunk (`kernels.shard`; levels >= 2, inputs checked by the
    caller, Triton on CUDA or in its CPU interpreter).

    The scatter kernel keeps each chunk's float32 sums; the received halos are added to them and the
    result is cast once, as in the single-device layer.
    """
    from kernels.shard import shard_attention

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
    where the single-device layer would run them (`uses_fused_kernels`), else the reference pipeline.
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
    if uses_fused_kernels(q, config):
        return fused_shard_attention(q, k, v, config, mesh)
    return reference_shard_attention(q, k, v, config, mesh)


class ContextParallelLighthouseAttention(LighthouseAttention):
    """`LighthouseAttention` on a sequence sharded head/tail over a 1-D context-parallel mesh; no parameters.

    forward(q, k, v) takes and returns this rank's shards in the [B, N_local, heads, D] layout.
    """

    def __init__(self, config: LighthouseConfig, mesh: DeviceMesh) -> None:
        super().__init__(config)
        ring_backend(config.backend, torch.device(mesh.device_type))
        self.mesh = mesh

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return context_parallel_lighthouse_attention(q, k, v, self.config, self.mesh)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, cp_degree={self.mesh.size()}"
