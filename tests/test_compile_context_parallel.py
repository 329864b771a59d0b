"""torch.compile of the context-parallel layer on 2 gloo ranks, under activation checkpointing as the trainer
runs it: the fused path (the kernels in Triton's interpreter) and the reference trace into one graph with no
break (the kernels are custom ops under compile, so Dynamo never enters Triton's launcher, where it failed
with "builtin isinstance() cannot determine type of argument TritonKernelVariable()"), and the compiled layer
equals the eager one, forward and backward, bit for bit. Ring attention only reads torch's dispatcher table
once it is on: on GPUs a write there stopped compile inside the checkpoint HOP ("HOP: Unsafe side effect")."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the gloo ranks hold CPU tensors, which compiled Triton does not take; on GPUs: scripts/cp_parity.py",
)

from lighthouse.context_parallel import context_parallel_lighthouse_attention, ring_causal_attention

from .cp_cases import NORM, NORM_CAUSAL, NORM_STRICT, fused_plans
from .helpers import fresh_seed


def _check_compiled_equals_eager(mesh, config, seed):
    torch.manual_seed(seed + mesh.get_local_rank())
    q = torch.randn(1, 128 // mesh.size(), 4, 8)  # chunks of 32 tokens: each reads the previous chunk's history
    k, v = (torch.randn(1, 128 // mesh.size(), 2, 8) for _ in range(2))
    grad_o = torch.randn_like(q)

    def layer(q, k, v):  # full activation checkpointing, as torchtitan's checkpoint wrapper runs a block
        return checkpoint(context_parallel_lighthouse_attention, q, k, v, config, mesh, use_reentrant=False)

    results = []  # fullgraph=True: one graph, or Dynamo raises naming the break
    for fn in (layer, torch.compile(layer, backend="aot_eager", fullgraph=True)):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        if fn is layer:  # eager: the case's implementation is the one that runs (a counter would break the graph)
            with fused_plans() as calls:
                out = fn(*leaves)
            assert bool(calls) == (config.implementation == "fused"), f"{len(calls)} fused plans"
        else:
            out = fn(*leaves)
        results.append((out, *torch.autograd.grad(out, leaves, grad_o)))
    for name, eager, compiled in zip(("o", "dq", "dk", "dv"), *results):
        assert torch.equal(eager, compiled), name


# About 20 s a case on 2 CPU cores: the fused causal case (kernels and the score-history exchange) runs in the
# fast loop, the others in the slow one.
CASES = [
    pytest.param("fused", NORM_CAUSAL, id="fused-causal"),
    pytest.param("fused", NORM, id="fused-paper", marks=pytest.mark.slow),
    pytest.param("fused", NORM_STRICT, id="fused-strict", marks=pytest.mark.slow),
    pytest.param("reference", NORM_CAUSAL, id="reference-causal", marks=pytest.mark.slow),
    pytest.param("reference", NORM, id="reference-paper", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("implementation, config", CASES)
def test_compiled_cp_layer_has_no_graph_break_and_equals_eager(ranks, implementation, config):
    config = dataclasses.replace(config, implementation=implementation)
    ranks.run(_check_compiled_equals_eager, 2, config, fresh_seed())


def _check_ring_attention_leaves_dispatcher_table(mesh):
    handlers = DTensor._op_dispatcher._custom_op_handlers
    q, k, v = (torch.randn(1, 16, 2, 8) for _ in range(3))
    ring_causal_attention(q, k, v, mesh)
    assert DTensor._op_dispatcher._custom_op_handlers is handlers


def test_ring_attention_writes_nothing_to_torch_dispatcher_once_it_is_on(ranks):
    ranks.run(_check_ring_attention_leaves_dispatcher_table, 2)
