"""SPEC section 6: context-parallel Lighthouse layers equal the single-device layer (CPU, gloo).

Two worker processes form one gloo group for the whole session (the `ranks` fixture of conftest.py); each
test sends them a check to run on a context-parallel mesh of degree 2 (or 1: each rank alone). Every rank
builds the same full-sequence inputs from the test's seed, runs the single-device layer on them, runs the
CP layer on its head/tail shards and compares its shards.
"""
from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lighthouse import LighthouseConfig, lighthouse_attention, select
from lighthouse.attention import resolve_backend
from lighthouse.context_parallel import (
    ContextParallelLighthouseAttention,
    check_context_parallel,
    context_parallel_lighthouse_attention,
    halo_destinations,
    halo_sources,
    offset_selection,
    owned_chunks,
    ring_options,
    shard_selections,
)

from .cp_cases import (
    DILATED, DILATED_CAUSAL, DILATED_STRICT, NORM, NORM_CAUSAL, NORM_STRICT, PARITY, rising_norm_inputs,
    shard_positions, strict_cases_slow,
)
from .helpers import cpu_flash_attn, fresh_seed, random_qkv


# ---------------------------------------------------------------- checks run on every rank


def _check_layer_parity(mesh, config, seq_len, heads, kv_heads, dtype, tol, rotate_method, seed):
    # float64 merges keep float64 exactness
    with ring_options(float32_merge=dtype != torch.float64, rotate_method=rotate_method):
        q, k, v = random_qkv(2, seq_len, heads, kv_heads, 8, dtype=dtype, requires_grad=True, seed=seed)
        grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype)
        full = lighthouse_attention(q, k, v, config)
        full.backward(grad_out)
        pos = shard_positions(mesh.get_local_rank(), mesh.size(), seq_len)
        local = [x.detach()[:, pos].requires_grad_(True) for x in (q, k, v)]
        out = context_parallel_lighthouse_attention(*local, config, mesh)
        out.backward(grad_out[:, pos])
    assert out.dtype == dtype
    torch.testing.assert_close(
        out, full.detach()[:, pos], rtol=tol, atol=tol, msg=lambda m: f"output (seed {seed}): {m}"
    )
    for name, shard, whole in zip("qkv", local, (q, k, v)):
        torch.testing.assert_close(
            shard.grad, whole.grad[:, pos], rtol=tol, atol=tol, msg=lambda m: f"grad {name} (seed {seed}): {m}"
        )


def _check_selection_slices(mesh, config, seq_len, inputs, seed):
    if inputs == "random":
        q, k, v = random_qkv(2, seq_len, 4, 2, 8, seed=seed)
    else:
        q, k, v = rising_norm_inputs(seq_len, 4, 2, seed)
    full = select(q, k, config, v=v)
    rank, cp_degree = mesh.get_local_rank(), mesh.size()
    pos = shard_positions(rank, cp_degree, seq_len)
    chunk_len, per_chunk = seq_len // (2 * cp_degree), config.gathered_len(seq_len) // (2 * cp_degree)
    selections = shard_selections(q[:, pos], k[:, pos], v[:, pos], config, mesh)
    for sel, chunk in zip(selections, owned_chunks(rank, cp_degree)):
        got = offset_selection(sel, chunk, chunk_len, config.pool)
        part = slice(chunk * per_chunk, (chunk + 1) * per_chunk)
        for field in ("level", "index", "expanded"):
            assert torch.equal(getattr(got, field), getattr(full, field)[..., part]), f"{field} of chunk {chunk}"


def _check_statistics(mesh, config, seq_len, seed):
    from recipe.logs.lighthouse_stats import selection_stats, shard_selection_stats

    q, k, v = random_qkv(2, seq_len, 4, 2, 8, seed=seed)
    full = selection_stats(select(q, k, config, v=v), config, seq_len)
    pos = shard_positions(mesh.get_local_rank(), mesh.size(), seq_len)
    sharded = shard_selection_stats(q[:, pos], k[:, pos], v[:, pos], config, mesh)
    assert set(sharded) == set(full)
    for name, value in full.items():
        assert sharded[name].item() == pytest.approx(value.item(), rel=1e-12, abs=1e-12), name
    assert 0 < full["evenness/l1"].item() < 1  # a histogram the chunks must really be merged for


def _check_module_equals_function(mesh, seed):
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=2, selection="paper")
    q, k, v = random_qkv(1, 128, 4, 2, 8, seed=seed)
    module = ContextParallelLighthouseAttention(config, mesh)
    assert list(module.parameters()) == []
    assert torch.equal(module(q, k, v), context_parallel_lighthouse_attention(q, k, v, config, mesh))


def _check_rejects_odd_local_length(mesh):
    q, k, v = random_qkv(1, 65, 2, 2, 8)
    with pytest.raises(ValueError, match="local sequence of 65 tokens is not a head and a tail chunk"):
        context_parallel_lighthouse_attention(q, k, v, LighthouseConfig(levels=1, pool=2, topk=4, tile_budget=2,
                                                                        selection="paper"), mesh)


def _check_rejects_layout_without_head_tail(mesh):
    q, k, v = random_qkv(1, 64, 2, 2, 8)
    config = LighthouseConfig(levels=2, pool=2, topk=8, tile_budget=2, selection="paper")
    with ring_options(load_balance=False), pytest.raises(
            ValueError, match="context_parallel_load_balancer must be 'headtail'"):
        context_parallel_lighthouse_attention(q, k, v, config, mesh)


def _check_flash_attn_layer_parity(mesh, seed):
    # FlashAttention's op rings through the handlers torch's ring attention gives SDPA (a CPU stand-in behind it)
    config, seq_len, heads, kv_heads, dtype, tol = PARITY["L3-p4-k8-m2-GQA-causal"]
    with cpu_flash_attn():
        config = dataclasses.replace(config, backend="flash_attn")
        _check_layer_parity(mesh, config, seq_len, heads, kv_heads, dtype, tol, "allgather", seed)


def _check_model_parity(mesh, seed, backend="auto"):
    with cpu_flash_attn():
        _model_parity(mesh, seed, backend)


def _model_parity(mesh, seed, backend):
    import models  # noqa: F401  (before torchtitan's model modules)
    from torchtitan.distributed.context_parallel import apply_cp_to_attention_module, prepare_context_parallel_input

    from models.llama3_lighthouse import FLAVORS, LighthouseLlama
    from models.llama3_lighthouse.parallelize import parallelize_lighthouse_attention

    # `backend` runs the Lighthouse layers and the dense layer (torchtitan's module for "auto")
    seq_len, config = 256, LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=4, selection="paper",
                                            backend=backend)
    args = dataclasses.replace(FLAVORS["debug"], lighthouse=config, dense_layers=(0,), max_seq_len=seq_len,
                               dense_backend="cudnn" if backend == "auto" else backend)
    torch.manual_seed(seed)
    single = LighthouseLlama(args).double()
    sharded = copy.deepcopy(single)
    tokens, labels = (torch.randint(0, args.vocab_size, (2, seq_len)) for _ in range(2))
    with ring_options(float32_merge=False):
        loss = F.cross_entropy(single(tokens).flatten(0, 1), labels.flatten())
        loss.backward()
        # What a parallelize function does: Lighthouse layers get the CP layer, dense SDPA torch's CP hooks.
        assert parallelize_lighthouse_attention(sharded, mesh) == args.n_layers - 1
        apply_cp_to_attention_module([b.attention.inner_attention for b in sharded.layers.values()], mesh, "sdpa")
        tokens_l, labels_l, extra = prepare_context_parallel_input(tokens, labels, {}, mesh, torch.device("cpu"))
        logits = sharded(tokens_l, positions=extra["positions"])
        loss_sum = F.cross_entropy(logits.flatten(0, 1), labels_l.flatten(), reduction="sum")
        (loss_sum / labels.numel()).backward()
    dist.all_reduce(loss_sum.detach(), group=mesh.get_group())
    torch.testing.assert_close(loss_sum / labels.numel(), loss.detach(), rtol=1e-12, atol=0)
    for (name, p), p_cp in zip(single.named_parameters(), sharded.parameters()):
        grad = p_cp.grad.clone()
        dist.all_reduce(grad, group=mesh.get_group())
        torch.testing.assert_close(grad, p.grad, rtol=1e-9, atol=1e-12, msg=lambda m: f"grad of {name}: {m}")


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("degree", [2, 1], ids=["cp2", "cp1"])
@pytest.mark.parametrize("name", strict_cases_slow(list(PARITY)))
def test_cp_layer_equals_the_single_device_layer_forward_and_backward(ranks, name, degree):
    config, seq_len, heads, kv_heads, dtype, tol = PARITY[name]
    ranks.run(_check_layer_parity, degree, config, seq_len, heads, kv_heads, dtype, tol, "allgather", fresh_seed())


def test_alltoall_rotation_gives_the_same_layer(ranks):
    config, seq_len, heads, kv_heads, dtype, tol = PARITY["L3-p4-k8-m2-GQA-halo15"]
    ranks.run(_check_layer_parity, 2, config, seq_len, heads, kv_heads, dtype, tol, "alltoall", fresh_seed())


@pytest.mark.parametrize(
    "config, inputs",
    # Rising norms: only the prefix guarantee expands a tile's first entry, so CP must apply it to chunk 0 only.
    # (Not for the dilated scorer: its scores would then tie up to float rounding.)
    strict_cases_slow([(NORM, "random"), (NORM, "rising-norms"), (DILATED, "random"), (NORM_CAUSAL, "random"),
                       (DILATED_CAUSAL, "random"), (NORM_STRICT, "random"), (DILATED_STRICT, "random")]),
    ids=["norm-random", "norm-rising-norms", "dilated-random", "norm-causal-random", "dilated-causal-random",
         "norm-strict-random", "dilated-strict-random"],
)
def test_each_rank_selects_its_slices_of_the_single_device_selection(ranks, config, inputs):
    ranks.run(_check_selection_slices, 2, config, 256, inputs, fresh_seed())


@pytest.mark.parametrize("config", [NORM, DILATED], ids=["norm", "dilated"])
def test_statistics_from_the_shards_equal_the_single_device_statistics(ranks, config):
    ranks.run(_check_statistics, 2, config, 256, fresh_seed())


@pytest.mark.parametrize("backend", ["auto", "flash_attn"])
def test_cp2_llama_equals_the_single_device_llama_in_loss_and_every_gradient(ranks, backend):
    ranks.run(_check_model_parity, 2, fresh_seed(), backend)


def test_flash_attn_cp_layer_equals_the_single_device_layer(ranks):
    ranks.run(_check_flash_attn_layer_parity, 2, fresh_seed())


def test_module_wraps_the_function(ranks):
    ranks.run(_check_module_equals_function, 2, fresh_seed())


def test_local_sequence_must_be_a_head_and_a_tail_chunk(ranks):
    ranks.run(_check_rejects_odd_local_length, 2)


def test_sequence_must_be_laid_out_head_tail(ranks):
    ranks.run(_check_rejects_layout_without_head_tail, 2)


@pytest.mark.parametrize("cp_degree", [1, 2, 3, 4, 8])
def test_halo_of_every_chunk_but_the_last_lands_on_the_next_chunk(cp_degree):
    landed = {}
    for rank in range(cp_degree):
        chunks = owned_chunks(rank, cp_degree)
        for slot, dst in enumerate(halo_destinations(rank, cp_degree)):
            if dst is not None:
                landed[chunks[slot]] = owned_chunks(dst[0], cp_degree)[dst[1]]
        for slot, src in enumerate(halo_sources(rank, cp_degree)):
            if src is not None:
                assert halo_destinations(src[0], cp_degree)[src[1]] == (rank, slot)
    assert landed == {c: c + 1 for c in range(2 * cp_degree - 1)}


@pytest.mark.parametrize(
    "kwargs, seq_len, cp_degree, message",
    [
        (dict(levels=3, pool=2, topk=8, tile_budget=4), 128, 2,
         "topk/tile_budget=2 tiles (topk=8, tile_budget=4) do not split evenly over the "
         "2*context_parallel_degree=4 chunks of seq_len=128 (context_parallel_degree=2)"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2), 48, 5,
         "seq_len=48 does not split into 2*context_parallel_degree=10 equal chunks"),
        (dict(levels=1, pool=2, topk=4, tile_budget=2), 66, 2,
         "seq_len=66 does not split into 2*context_parallel_degree=4 equal chunks"),
        (dict(levels=2, pool=2, topk=8, tile_budget=2, scorer="dilated", dilation=64), 128, 2,
         "chunk length seq_len/(2*context_parallel_degree)=32 (seq_len=128, context_parallel_degree=2) "
         "is not divisible by dilation=64"),
        (dict(levels=3, pool=4, topk=8, tile_budget=2), 100, 2, "seq_len=100 is not divisible by pool**(levels-1)=16"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2), 64, 0, "context_parallel_degree=0 must be >= 1"),
    ],
    ids=["tiles-cross-chunks", "chunks-uneven", "dense-chunks-uneven", "dilation", "single-device-rule", "degree"],
)
def test_non_dividing_geometry_is_rejected_naming_the_values(kwargs, seq_len, cp_degree, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_context_parallel(LighthouseConfig(**kwargs), seq_len, cp_degree)


def test_backends_without_ring_attention_are_rejected():
    with pytest.raises(ValueError, match="backend='math' has no ring attention"):
        resolve_backend("math", torch.device("cpu"), torch.float32, ring=True)


def test_auto_backend_rings_with_flash_on_cpu_and_cudnn_on_cuda():
    assert resolve_backend("auto", torch.device("cpu"), torch.float32, ring=True) == "flash"
    assert resolve_backend("auto", torch.device("cuda"), torch.bfloat16, ring=True) == "cudnn"
