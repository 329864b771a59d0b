"""The fused layer's one autograd node computes what gather, attention and scatter-back compute as three nodes,
bit for bit, eager and under torch.compile, and its two custom ops pass torch's operator checks.

On CPU the node holds the flash kernel's ops (Triton's interpreter runs the kernels), on CUDA cuDNN's.
"""
import pytest
import torch

pytest.importorskip("triton")

from lighthouse import LighthouseConfig
from lighthouse.fused import attend_in_order, pool_and_score_pyramids, select_gather_order
from lighthouse.fused_node import FIELDS, fused_lighthouse_attention

from .helpers import DEVICE, random_qkv

BACKEND = "cudnn" if DEVICE.type == "cuda" else "flash"
DTYPES = (torch.float16, torch.bfloat16) if DEVICE.type == "cuda" else (torch.float16, torch.float32)
# (batch, seq_len, heads, kv_heads, dim, LighthouseConfig kwargs)
CASES = [
    (2, 256, 4, 2, 16, dict(levels=3, pool=2, topk=16, tile_budget=4)),
    (1, 256, 2, 2, 32, dict(levels=2, pool=4, topk=8, tile_budget=8)),
    (2, 256, 4, 1, 16, dict(levels=3, pool=4, topk=8, tile_budget=2, selection="causal")),
    (1, 128, 2, 1, 16, dict(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=2)),
]
CASE_IDS = ["B2-H4-G2-L3-p2", "B1-G=H-L2-p4", "B2-H4-G1-causal", "dilated"]


def _three_nodes(q, k, v, config):
    with torch.no_grad():
        pyramid, sq, sk = pool_and_score_pyramids(q, k, v, config)
        order = select_gather_order(sq, sk, q.shape[1], config)
    return attend_in_order(q, k, v, pyramid, order, config)


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
    config = LighthouseConfig(levels=2, pool=2, topk=8, tile_budget=4, backend="math")
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


@pytest.mark.parametrize("b, n, h, g, d, kwargs", CASES[:3], ids=CASE_IDS[:3])
def test_custom_ops_pass_opcheck(b, n, h, g, d, kwargs):
    config = LighthouseConfig(**kwargs, backend=BACKEND)
    fields = tuple(getattr(config, name) for name in FIELDS)
    q, k, v = random_qkv(b, n, h, g, d, dtype=torch.float16, device=DEVICE)
    torch.library.opcheck(torch.ops.lighthouse.fused_forward.default, (q, k, v, *fields))
    o, *saved = torch.ops.lighthouse.fused_forward(q, k, v, *fields)
    torch.library.opcheck(torch.ops.lighthouse.fused_backward.default,
                          (torch.randn_like(o), *saved, g, config.pool, config.levels, BACKEND))
