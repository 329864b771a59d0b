"""The fused layer computes the reference layer's function: outputs and gradients within the error table."""
import pytest
import torch

from lighthouse import LighthouseConfig, reference_lighthouse_attention

from ._testing import CPU_DTYPES, DEVICE, assert_close, random_qkv
from .fused import fused_lighthouse_attention

DTYPES = CPU_DTYPES + ((torch.bfloat16,) if DEVICE.type == "cuda" else ())
# (batch, seq_len, heads, kv_heads, dim, LighthouseConfig kwargs)
CASES = [
    (1, 256, 4, 2, 16, dict(levels=3, pool=2, topk=16, tile_budget=4)),
    (2, 128, 2, 2, 32, dict(levels=2, pool=4, topk=8, tile_budget=8)),
    (1, 128, 2, 1, 16, dict(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=2)),
    (1, 64, 2, 2, 16, dict(levels=1, pool=2, topk=4, tile_budget=4)),
    (2, 256, 4, 2, 16, dict(levels=3, pool=4, topk=8, tile_budget=2, selection="causal")),
    (1, 128, 2, 1, 16, dict(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=2, selection="causal")),
]
CASE_IDS = ["B1-N256-H4-G2-L3-p2", "B2-N128-H2-G2-L2-p4", "B1-N128-H2-G1-dilated", "L1-dense", "B2-N256-L3-p4-causal",
            "B1-N128-dilated-causal"]


def _run(fn, q, k, v, config, grad_o):
    out = fn(q, k, v, config)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_o))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b, n, h, g, d, kwargs", CASES, ids=CASE_IDS)
def test_layer_output_and_gradients_equal_reference(b, n, h, g, d, kwargs, dtype):
    # fp32 attention on CUDA takes the efficient kernel (cuDNN SDPA has no fp32 path)
    backend = "efficient" if DEVICE.type == "cuda" and dtype == torch.float32 else "auto"
    config = LighthouseConfig(**kwargs, backend=backend)
    q, k, v = random_qkv(b, n, h, g, d, dtype, requires_grad=True)
    grad_o = torch.randn_like(q)
    fast = _run(fused_lighthouse_attention, q, k, v, config, grad_o)
    ref = _run(reference_lighthouse_attention, q, k, v, config, grad_o)
    assert fast[0].dtype == dtype
    for name, r, f in zip(("o", "dq", "dk", "dv"), ref, fast):
        assert_close(name, r, f, dtype)


def test_layer_is_bit_identical_across_runs():
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4)
    q, k, v = random_qkv(1, 128, 2, 1, 16, torch.float16, requires_grad=True)
    grad_o = torch.randn_like(q)
    first, second = (_run(fused_lighthouse_attention, q, k, v, config, grad_o) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_unsupported_inputs_are_rejected_with_their_values():
    config = LighthouseConfig(levels=2, pool=2, topk=4, tile_budget=4)
    q, k, v = random_qkv(1, 32, 2, 2, 8, torch.float64)
    with pytest.raises(ValueError, match="got dtype=torch.float64, head dim=8"):
        fused_lighthouse_attention(q, k, v, config)
