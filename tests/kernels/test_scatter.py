"""The fused scatter-back equals `lighthouse.scatter_back` forward and backward, bit for bit run after run."""
import pytest
import torch

pytest.importorskip("triton")

from lighthouse import LighthouseConfig
from lighthouse import scatter_back as reference_scatter_back
from lighthouse.testing import assert_close
from ..helpers import DEVICE, KERNEL_DTYPES
from ..kernel_inputs import random_selection

from lighthouse_kernels.scatter import scatter_back

# (batch, seq_len, heads, kv_heads, dim, levels, pool, topk, tile_budget)
CASES = [(2, 128, 4, 2, 16, 3, 2, 16, 4), (1, 256, 2, 2, 24, 3, 4, 8, 4), (1, 64, 2, 1, 8, 4, 2, 4, 2)]
CASE_IDS = [f"B{c[0]}-N{c[1]}-H{c[2]}-G{c[3]}-D{c[4]}-L{c[5]}-p{c[6]}-k{c[7]}-m{c[8]}" for c in CASES]


def _inputs(b, n, h, g, d, levels, pool, topk, budget, dtype):
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection="paper")
    packed, slots, flat = random_selection(b, g, n, config)
    o_tilde = torch.randn(b, packed.shape[-1], h, d, device=DEVICE, dtype=dtype, requires_grad=True)
    return o_tilde, packed, slots, flat


@pytest.mark.parametrize("spill", [False, True], ids=["clipped", "spill"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("b, n, h, g, d, levels, pool, topk, budget", CASES, ids=CASE_IDS)
def test_scatter_and_its_gradient_equal_reference(b, n, h, g, d, levels, pool, topk, budget, dtype, spill):
    o_tilde, packed, slots, flat = _inputs(b, n, h, g, d, levels, pool, topk, budget, dtype)
    fast = scatter_back(o_tilde, slots, n, pool, levels, spill)
    ref = reference_scatter_back(o_tilde, flat, n, pool, levels, spill)
    assert_close("o", ref, fast, dtype)
    grad_o = torch.randn_like(ref)
    (grad,) = torch.autograd.grad(fast, o_tilde, grad_o)
    (ref_grad,) = torch.autograd.grad(ref, o_tilde, grad_o)
    assert_close("do_tilde", ref_grad, grad, dtype)


def test_scatter_is_bit_identical_across_runs():
    o_tilde, packed, slots, _ = _inputs(1, 128, 2, 1, 16, 3, 2, 16, 4, torch.float16)
    grad_o = torch.randn(1, 128, 2, 16, device=DEVICE, dtype=torch.float16)
    runs = []
    for _ in range(2):
        out = scatter_back(o_tilde, slots, 128, 2, 3)
        runs.append((out, *torch.autograd.grad(out, o_tilde, grad_o)))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_float32_output_keeps_the_sums_of_16_bit_rows_unrounded():
    o_tilde, packed, slots, flat = _inputs(1, 128, 2, 1, 16, 3, 2, 16, 4, torch.float16)
    fast = scatter_back(o_tilde, slots, 128, 2, 3, spill=True, out_dtype=torch.float32)
    ref = reference_scatter_back(o_tilde.float(), flat, 128, 2, 3, spill=True)
    assert fast.dtype == torch.float32
    assert_close("o", ref, fast, torch.float32)
    grad_o = torch.randn_like(ref)
    (grad,) = torch.autograd.grad(fast, o_tilde, grad_o)
    (ref_grad,) = torch.autograd.grad(ref, o_tilde, grad_o)
    assert grad.dtype == torch.float16
    assert_close("do_tilde", ref_grad, grad, torch.float16)
