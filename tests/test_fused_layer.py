"""The fused layer computes the reference layer's function: outputs and gradients within the error table.

`implementation="fused"` forces the fused pipeline (on CPU in Triton's interpreter), "reference" the pure
PyTorch one; both go through the public `lighthouse_attention`.
"""
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from lighthouse import LighthouseConfig, fused_node, lighthouse_attention
from lighthouse.testing import assert_close

from .helpers import DEVICE, KERNEL_DTYPES, random_qkv

# (batch, seq_len, heads, kv_heads, dim, LighthouseConfig kwargs). The interpreter's cost grows with the rows
# (batch * kv heads) and tokens: one sequence where a case is about the selection rule or the pyramid's depth
# (the kernels take batch and kv heads alike, as rows; the second case takes two sequences), and short
# sequences, each tile still with more coarsest entries than its budget.
CASES = [
    (1, 128, 4, 2, 16, dict(levels=3, pool=2, topk=16, tile_budget=4, selection="paper")),
    (2, 128, 2, 2, 32, dict(levels=2, pool=4, topk=8, tile_budget=8, selection="paper")),
    (1, 128, 2, 1, 16, dict(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=2, selection="paper")),
    (1, 64, 2, 2, 16, dict(levels=1, pool=2, topk=4, tile_budget=4)),
    (1, 256, 4, 2, 16, dict(levels=3, pool=4, topk=8, tile_budget=2, selection="causal")),
    (1, 128, 2, 1, 16, dict(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=2, selection="causal")),
    (1, 256, 4, 2, 16, dict(levels=3, pool=4, topk=8, tile_budget=2, selection="strict")),
    (1, 256, 2, 1, 16, dict(levels=4, pool=2, topk=16, tile_budget=4, selection="strict")),
    (1, 128, 2, 1, 16, dict(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=2, selection="strict")),
]
CASE_IDS = ["B1-N128-H4-G2-L3-p2", "B2-N128-H2-G2-L2-p4", "B1-N128-H2-G1-dilated", "L1-dense", "B1-N256-L3-p4-causal",
            "B1-N128-dilated-causal", "B1-N256-L3-p4-strict", "B1-N256-G1-L4-p2-strict", "B1-N128-dilated-strict"]


def _run(implementation, q, k, v, config, grad_o):
    """Output and input gradients of the public layer with `implementation`; a Lighthouse config (levels > 1) must
    reach the fused kernels exactly when it names "fused", so that no comparison is of the reference with itself."""
    calls = []

    def counted(function):
        return lambda *args, **kwargs: (calls.append(function.__name__), function(*args, **kwargs))[1]

    with pytest.MonkeyPatch.context() as patch:
        for name in ("fused_forward", "plan"):  # the fused node's two ways in: one autograd node, or plan + attend
            patch.setattr(fused_node, name, counted(getattr(fused_node, name)))
        out = lighthouse_attention(q, k, v, dataclasses.replace(config, implementation=implementation))
    if config.levels > 1:
        assert bool(calls) == (implementation == "fused"), (implementation, calls)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_o))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("b, n, h, g, d, kwargs", CASES, ids=CASE_IDS)
def test_layer_output_and_gradients_equal_reference(b, n, h, g, d, kwargs, dtype):
    # fp32 attention on CUDA takes the efficient kernel (cuDNN SDPA has no fp32 path)
    backend = "efficient" if DEVICE.type == "cuda" and dtype == torch.float32 else "auto"
    config = LighthouseConfig(**kwargs, backend=backend)
    q, k, v = random_qkv(b, n, h, g, d, dtype=dtype, device=DEVICE, requires_grad=True)
    grad_o = torch.randn_like(q)
    fast = _run("fused", q, k, v, config, grad_o)
    ref = _run("reference", q, k, v, config, grad_o)
    assert fast[0].dtype == dtype
    for name, r, f in zip(("o", "dq", "dk", "dv"), ref, fast):
        assert_close(name, r, f, dtype)


def test_layer_is_bit_identical_across_runs():
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="paper")
    q, k, v = random_qkv(1, 128, 2, 1, 16, dtype=torch.float16, device=DEVICE, requires_grad=True)
    grad_o = torch.randn_like(q)
    first, second = (_run("fused", q, k, v, config, grad_o) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_unsupported_inputs_are_rejected_with_their_values():
    config = LighthouseConfig(levels=2, pool=2, topk=4, tile_budget=4, implementation="fused", selection="paper")
    q, k, v = random_qkv(1, 32, 2, 2, 8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="got dtype=torch.float64, head dim=8"):
        lighthouse_attention(q, k, v, config)
