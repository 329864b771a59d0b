"""The context-parallel layer on the fused kernels equals it on the reference pipeline (2 gloo ranks).

On a machine without CUDA the kernels run in Triton's interpreter (conftest.py; the worker processes
inherit the setting); without Triton the module is skipped. The dispatch rule takes the fused path by
itself on CUDA only, so the checks ask for each implementation with `implementation="fused"` / "reference":
per-chunk selection index for index, then the layer's output and input gradients.
q and k get a random permutation of well separated norms, so the pooling kernel's float32 norms and the
reference's (summed in another order) rank tokens alike and both paths select the same entries.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the gloo ranks hold CPU tensors, which compiled Triton does not take; on GPUs: scripts/cp_parity.py",
)

from lighthouse import fused, reference
from lighthouse.context_parallel import context_parallel_lighthouse_attention, shard_selections
from lighthouse.pipeline import pipeline_for
from lighthouse.testing import assert_close

from .cp_cases import (
    DILATED, DILATED_CAUSAL, DILATED_STRICT, NORM, NORM_CAUSAL, NORM_STRICT, PARITY, fused_plans, rising_norm_inputs,
    shard_positions, strict_cases_slow,
)
from .helpers import fresh_seed, vectors_with_norms

DTYPE = torch.float32  # the CPU ring runs float32; the interpreter compares 16-bit dtypes less faithfully


def _distinct_norm_qkv(local_len: int, heads: int, kv_heads: int, dim: int, seed: int, rank: int, world: int):
    """This rank's q [2, N, H, D], k, v [2, N, G, D] (float32, fresh per seed and rank); the norms of q, resp.
    k, a random permutation of this rank's share of 1 + i/count, i < count over all ranks: no two tokens'
    scores are within float32 rounding, also across ranks (causal selection compares a chunk's scores with
    the previous chunk's, which another rank holds)."""
    torch.manual_seed(seed)
    q_norms, k_norms = (1 + (torch.randperm(2 * local_len * h) + rank * 2 * local_len * h).view(2, local_len, h)
                        / (world * 2 * local_len * h) for h in (heads, kv_heads))
    q, k = (vectors_with_norms(n.double(), dim) for n in (q_norms, k_norms))
    return q.to(DTYPE), k.to(DTYPE), torch.randn(2, local_len, kv_heads, dim, dtype=DTYPE)


def _local_inputs(mesh, inputs: str, seq_len: int, heads: int, kv_heads: int, seed: int):
    local_len = seq_len // mesh.size()
    seed += mesh.get_local_rank()
    if inputs == "distinct-norms":
        return _distinct_norm_qkv(local_len, heads, kv_heads, 8, seed, mesh.get_local_rank(), mesh.size())
    # rising norms over the whole sequence: only the prefix guarantee expands a tile's first entry
    pos = shard_positions(mesh.get_local_rank(), mesh.size(), seq_len)
    return tuple(x[:, pos].to(DTYPE) for x in rising_norm_inputs(seq_len, heads, kv_heads, seed))


def _on(config, implementation: str):
    return dataclasses.replace(config, implementation=implementation)


def _check_selection(mesh, config, seq_len, inputs, seed):
    # two query heads on one kv head: selection reads a kv group's scores, whatever its size (the layer cases
    # below take MHA, GQA and MQA); the kernels' cost in Triton's interpreter grows with the kv heads
    q, k, v = _local_inputs(mesh, inputs, seq_len, 2, 1, seed)
    with fused_plans() as calls:
        fast = shard_selections(q, k, v, _on(config, "fused"), mesh)
    assert calls, "the fused selection never planned on the fused kernels"
    with fused_plans() as calls:
        ref = shard_selections(q, k, v, _on(config, "reference"), mesh)
    assert not calls, "the reference selection planned on the fused kernels"
    for half, (got, want) in enumerate(zip(fast, ref)):
        for field in ("level", "index", "expanded"):
            assert torch.equal(getattr(got, field), getattr(want, field)), f"{field} of chunk half {half} (seed {seed})"


def _check_layer(mesh, config, seq_len, heads, kv_heads, seed):
    inputs = _local_inputs(mesh, "distinct-norms", seq_len, heads, kv_heads, seed)
    grad_out = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(seed + 7), dtype=DTYPE)
    results = {}
    for name in ("fused", "reference"):
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        with fused_plans() as calls:
            out = context_parallel_lighthouse_attention(*leaves, _on(config, name), mesh)
        assert bool(calls) == (name == "fused"), f"{name}: {len(calls)} fused plans"
        out.backward(grad_out)
        results[name] = (out.detach(), *(x.grad for x in leaves))
    assert results["fused"][0].dtype == DTYPE
    for name, ref, fast in zip(("o", "dq", "dk", "dv"), results["reference"], results["fused"]):
        assert_close(f"{name} (seed {seed})", ref, fast, DTYPE)


def _check_dispatch(mesh, seed):
    q, k, v = _local_inputs(mesh, "distinct-norms", 256, 4, 2, seed)
    # on CPU the rule says reference, and the layer runs it; where the rule says fused, the layer runs the kernels
    assert pipeline_for(q, NORM) is reference and pipeline_for(q, _on(NORM, "fused")) is fused
    with fused_plans() as calls:
        auto = context_parallel_lighthouse_attention(q, k, v, NORM, mesh)
    assert not calls
    assert torch.equal(auto, context_parallel_lighthouse_attention(q, k, v, _on(NORM, "reference"), mesh))
    with fused_plans() as calls:
        context_parallel_lighthouse_attention(q, k, v, _on(NORM, "fused"), mesh)
    assert calls


@pytest.mark.parametrize(
    "config, inputs",
    strict_cases_slow([(NORM, "distinct-norms"), (NORM, "rising-norms"), (DILATED, "distinct-norms"),
                       (NORM_CAUSAL, "distinct-norms"), (DILATED_CAUSAL, "distinct-norms"),
                       (NORM_STRICT, "distinct-norms"), (DILATED_STRICT, "distinct-norms")]),
    ids=["norm-random", "norm-rising-norms-prefix", "dilated-random", "norm-causal-random", "dilated-causal-random",
         "norm-strict-random", "dilated-strict-random"],
)
def test_fused_per_chunk_selection_equals_the_reference_index_for_index(ranks, config, inputs):
    ranks.run(_check_selection, 2, config, 256, inputs, fresh_seed())


# The CP parity cases (cp_cases.PARITY) with levels >= 2 (the fused path), in float32.
LAYER_CASES = ["L3-p2-k16-m4-MHA", "L3-p4-k8-m2-GQA-halo15", "L4-p2-k8-m2-MQA", "L3-p2-dilated",
               "L3-p4-k8-m2-GQA-causal", "L3-p4-k8-m2-GQA-strict"]


def _layer_case(name: str):
    config, seq_len, heads, kv_heads, *_ = PARITY[name]
    return config, seq_len, heads, kv_heads


@pytest.mark.parametrize("name", strict_cases_slow(LAYER_CASES))
def test_fused_cp_layer_equals_the_reference_cp_layer_forward_and_backward(ranks, name):
    ranks.run(_check_layer, 2, *_layer_case(name), fresh_seed())


def test_cp1_fused_layer_equals_the_reference(ranks):
    ranks.run(_check_layer, 1, *_layer_case("L3-p4-k8-m2-GQA-halo15"), fresh_seed())


def test_cp_layer_takes_the_path_the_dispatch_rule_names(ranks):
    ranks.run(_check_dispatch, 2, fresh_seed())
