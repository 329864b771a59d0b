"""The fused layer's one autograd node computes what gather, attention and scatter-back compute as three nodes,
bit for bit, eager and under torch.compile (where it is the forward op with a registered backward, which
activation checkpointing recomputes), and its two custom ops pass torch's operator checks.

On CPU the node holds the flash kernel's ops (Triton's interpreter runs the kernels), on CUDA cuDNN's.
"""
import pytest
import torch

pytest.importorskip("triton")

from lighthouse import LighthouseConfig
from lighthouse.fused import attend, plan
from lighthouse.fused_node import fused_lighthouse_attention, settings

from .helpers import DEVICE, random_qkv

BACKEND = "cudnn" if DEVICE.type == "cuda" else "flash"
DTYPES = (torch.float16, torch.bfloat16) if DEVICE.type == "cuda" else (torch.float16, torch.float32)
# (batch, seq_len, heads, kv_heads, dim, LighthouseConfig kwargs)
# The first case, which the compiled, op and checkpoint tests also take, is one sequence: batch 2 is the causal
# case's (the node's batch dimension is one code path). Short sequences, each tile still with more coarsest
# entries than its budget: the interpreter's cost grows with the programs (rows, tiles, token blocks).
CASES = [
    (1, 128, 4, 2, 16, dict(levels=3, pool=2, topk=16, tile_budget=4, selection="paper")),
    (1, 128, 2, 2, 32, dict(levels=2, pool=4, topk=8, tile_budget=8, selection="paper")),
    (2, 128, 4, 1, 16, dict(levels=3, pool=4, topk=4, tile_budget=2, selection="causal")),
    (1, 128, 2, 1, 16, dict(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=2, selection="paper")),
]
CASE_IDS = ["B1-H4-G2-L3-p2", "B1-G=H-L2-p4", "B2-H4-G1-causal", "dilated"]


def _three_nodes(q, k, v, config):
    return attend(q, k, v, plan(q, k, v, config), config)


def _output_and_grads(layer, q, k, v, config, grad_o):
    out = layer(q, k, v, config)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_o))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b, n, h, g, d, kwargs", CASES, ids=CASE_IDS)
def test_one_node_equals_three_nodes_bit_for_bit(b, n, h, g, d, kwargs, dtype):
    config = LighthouseConfig(**kwargs, backend=BACKEND)
    q, k, v = random_qkv(b, n, h, g, d, dtype=dtype, device=DEVICE, requires_grad=True)
    grad_o = torch.randn_like(q)
    one = _output_and_grads(fused_lighthouse_attention, q, k, v, config, grad_o)
    three = _output_and_grads(_three_nodes, q, k, v, config, grad_o)
    assert type(one[0].grad_fn).__name__ == "FusedLighthouseBackward"
    assert type(three[0].grad_fn).__name__ == "ScatterBackBackward"
    for name, a, b_ in zip(("o", "dq", "dk", "dv"), one, three):
        assert torch.equal(a, b_), name
    with torch.no_grad():
        assert torch.equal(fused_lighthouse_attention(q, k, v, config), one[0])


def test_backends_without_direct_ops_take_three_nodes():
    config = LighthouseConfig(levels=2, pool=2, topk=8, tile_budget=4, backend="math", selection="paper")
    q, k, v = random_qkv(1, 64, 2, 2, 16, dtype=torch.float32, device=DEVICE, requires_grad=True)
    assert type(fused_lighthouse_attention(q, k, v, config).grad_fn).__name__ == "ScatterBackBackward"


def test_compiled_layer_equals_eager_bit_for_bit():
    b, n, h, g, d, kwargs = CASES[0]
    config = LighthouseConfig(**kwargs, backend=BACKEND)
    q, k, v = random_qkv(b, n, h, g, d, dtype=torch.float16, device=DEVICE, requires_grad=True)
    grad_o = torch.randn_like(q)
    compiled = torch.compile(fused_lighthouse_attention, fullgraph=True)
    eager = _output_and_grads(fused_lighthouse_attention, q, k, v, config, grad_o)
    for name, a, b_ in zip(("o", "dq", "dk", "dv"), eager, _output_and_grads(compiled, q, k, v, config, grad_o)):
        assert torch.equal(a, b_), name


def test_compiled_three_node_path_calls_the_stage_ops_and_equals_eager_bit_for_bit():
    # a backend without direct ops: gather, attention and scatter-back, whose kernels are custom ops under compile
    b, n, h, g, d, kwargs = CASES[0]  # the shapes the test above compiles with: no recompile with dynamic shapes
    config = LighthouseConfig(**{**kwargs, "selection": "causal"}, backend="math")
    q, k, v = random_qkv(b, n, h, g, d, dtype=torch.float32, device=DEVICE, requires_grad=True)
    grad_o = torch.randn_like(q)
    compiled = torch.compile(fused_lighthouse_attention, backend="aot_eager", fullgraph=True)
    eager = _output_and_grads(fused_lighthouse_attention, q, k, v, config, grad_o)
    for name, a, b_ in zip(("o", "dq", "dk", "dv"), eager, _output_and_grads(compiled, q, k, v, config, grad_o)):
        assert torch.equal(a, b_), name


def test_the_forward_ops_registered_backward_equals_the_node_bit_for_bit():
    b, n, h, g, d, kwargs = CASES[0]
    config = LighthouseConfig(**kwargs, backend=BACKEND)
    fields = settings(config)
    q, k, v = random_qkv(b, n, h, g, d, dtype=torch.float16, device=DEVICE, requires_grad=True)
    grad_o = torch.randn_like(q)
    node = _output_and_grads(fused_lighthouse_attention, q, k, v, config, grad_o)
    op = _output_and_grads(lambda *x: torch.ops.lighthouse.fused_forward(*x[:3], *fields)[0], q, k, v, config, grad_o)
    for name, a, b_ in zip(("o", "dq", "dk", "dv"), node, op):
        assert torch.equal(a, b_), name


def test_checkpointed_compiled_block_recomputes_the_layer_instead_of_keeping_its_tensors():
    # With an autograd.Function around the op, torch 2.11 kept the op's gathered rows, O~ and logsumexp for
    # the backward of a checkpointed compiled block, per layer.
    b, n, h, g, d, kwargs = CASES[0]
    config = LighthouseConfig(**kwargs, backend=BACKEND)
    w = torch.randn(h * d, (h + 2 * g) * d, device=DEVICE, dtype=torch.float16) / d
    x = torch.randn(b, n, h * d, device=DEVICE, dtype=torch.float16, requires_grad=True)

    def block(x):
        q, k, v = (x @ w).split((h * d, g * d, g * d), dim=-1)
        o = fused_lighthouse_attention(q.unflatten(-1, (h, d)), k.unflatten(-1, (g, d)), v.unflatten(-1, (g, d)),
                                       config)
        return x + o.flatten(2)

    def checkpointed(x):
        return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)

    eager = torch.autograd.grad(checkpointed(x).float().square().sum(), x)[0]
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.shape) or t, lambda t: t):
        y = torch.compile(checkpointed, fullgraph=True)(x)
    assert sorted(kept) == sorted([x.shape, w.shape])
    assert torch.equal(torch.autograd.grad(y.float().square().sum(), x)[0], eager)


@pytest.mark.parametrize("b, n, h, g, d, kwargs", CASES[:2], ids=["H4-G2-L3-p2", "G=H-L2-p4"])
def test_custom_ops_pass_opcheck(b, n, h, g, d, kwargs):
    """opcheck runs each op many times over (schema, fake tensors, autograd registration, AOT dispatch): one
    sequence of half the length keeps it quick in Triton's interpreter; the op's registration does not depend
    on B or N."""
    config = LighthouseConfig(**kwargs, backend=BACKEND)
    fields = settings(config)
    q, k, v = random_qkv(1, n // 2, h, g, d, dtype=torch.float16, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.lighthouse.fused_forward.default, (q, k, v, *fields))
    q, k, v = (x.detach() for x in (q, k, v))
    o, *saved = torch.ops.lighthouse.fused_forward(q, k, v, *fields)
    torch.library.opcheck(torch.ops.lighthouse.fused_backward.default,
                          (torch.randn_like(o), *saved, g, config.pool, config.levels, BACKEND))
