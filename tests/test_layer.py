"""SPEC sections 4-5: the layer's causality, exactness, determinism, gradients and GQA behaviour."""
import pytest
import torch
import torch.nn.functional as F

from lighthouse import LighthouseAttention, LighthouseConfig, lighthouse_attention, select

from .helpers import random_qkv

CONFIGS = {
    "L3-p2-k8-m4": (LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="paper"), 128),
    "L2-p4-k8-m8": (LighthouseConfig(levels=2, pool=4, topk=8, tile_budget=8, selection="paper"), 256),
    "L4-p2-k4-m2": (LighthouseConfig(levels=4, pool=2, topk=4, tile_budget=2, selection="paper"), 128),
    "L3-p2-dilated": (LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=4,
                                       selection="paper"), 128),
    "L3-p4-k8-m2-causal": (LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="causal"), 256),
}


@pytest.mark.parametrize("name", [name for name, (c, _) in CONFIGS.items() if c.scorer == "norm"])
def test_output_at_j_depends_only_on_positions_up_to_j(name):
    # Rotating q, k after j keeps their norms, so the norm scorer selects the same set.
    config, n = CONFIGS[name]
    q, k, v = random_qkv(2, n, 4, 2, 8)
    j = int(torch.randint(n // 4, n - 2, ()).item())
    rotation = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64)).Q
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, j + 1 :] = q[:, j + 1 :] @ rotation
    k2[:, j + 1 :] = k[:, j + 1 :] @ rotation
    v2[:, j + 1 :] = torch.randn_like(v[:, j + 1 :])
    sel, sel2 = select(q, k, config), select(q2, k2, config)
    assert torch.equal(sel.index, sel2.index) and torch.equal(sel.level, sel2.level)
    out, out2 = lighthouse_attention(q, k, v, config), lighthouse_attention(q2, k2, v2, config)
    torch.testing.assert_close(out2[:, : j + 1], out[:, : j + 1], rtol=0, atol=1e-12)
    assert not torch.allclose(out2[:, j + 1 :], out[:, j + 1 :])


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_one_level_is_dense_causal_sdpa(heads, kv_heads):
    q, k, v = random_qkv(2, 64, heads, kv_heads, 16)
    out = lighthouse_attention(q, k, v, LighthouseConfig(levels=1, pool=2, topk=4, tile_budget=2, selection="paper"))
    rep = heads // kv_heads
    dense = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(rep, 2).transpose(1, 2), v.repeat_interleave(rep, 2).transpose(1, 2),
        is_causal=True,
    ).transpose(1, 2)
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["L3-p2-k8-m4", "L3-p2-dilated"])
def test_outputs_and_gradients_are_bit_identical_across_runs(name, dtype):
    config, n = CONFIGS[name]
    q, k, v = random_qkv(2, n, 4, 2, 8, dtype=dtype)
    grad_out = torch.randn(2, n, 4, 8, dtype=dtype)

    def run():
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        out = lighthouse_attention(*leaves, config)
        out.backward(grad_out)
        return [out.detach()] + [x.grad for x in leaves]

    first, second = run(), run()
    assert first[0].dtype == dtype
    for a, b in zip(first, second):
        assert torch.equal(a, b)


SMALL_CONFIGS = {
    "L3-p2-k4-m2": LighthouseConfig(levels=3, pool=2, topk=4, tile_budget=2, selection="paper"),
    "L2-p4-k4-m2": LighthouseConfig(levels=2, pool=4, topk=4, tile_budget=2, selection="paper"),
    "L3-p2-dilated": LighthouseConfig(levels=3, pool=2, topk=4, tile_budget=2, scorer="dilated", dilation=2,
                                      selection="paper"),
}


@pytest.mark.parametrize("name", list(SMALL_CONFIGS))
def test_gradients_match_finite_differences_in_float64(name):
    config = SMALL_CONFIGS[name]
    q, k, v = random_qkv(1, 32, 2, 1, 4, requires_grad=True)
    # Selection is piecewise constant in q and k, so finite differences see only the attention path. fast_mode
    # compares random projections u^T J v of the analytic and numerical Jacobians: one perturbation per input
    # instead of one per element, and a wrong gradient still fails.
    assert torch.autograd.gradcheck(lambda a, b, c: lighthouse_attention(a, b, c, config), (q, k, v), fast_mode=True)


def test_every_input_receives_gradient_through_pooling():
    config, n = CONFIGS["L3-p2-k8-m4"]
    q, k, v = random_qkv(1, n, 2, 2, 8, requires_grad=True)
    lighthouse_attention(q, k, v, config).pow(2).sum().backward()
    for x in (q, k, v):
        assert (x.grad.abs().sum(-1) > 0).all()


def test_gqa_equals_mha_with_repeated_kv_heads():
    # MHA selects per query head; GQA per kv group with the group's max query score. They agree when the
    # query heads of a group have equal per-token norms: head 1 is an orthogonal rotation of head 0.
    config, n = CONFIGS["L3-p2-k8-m4"]
    _, k, v = random_qkv(2, n, 2, 2, 8)
    base = torch.randn(2, n, 2, 8, dtype=torch.float64)
    rotation = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64)).Q
    q = torch.stack([base, base @ rotation], dim=3).reshape(2, n, 4, 8)
    gqa = lighthouse_attention(q, k, v, config)
    mha = lighthouse_attention(q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2), config)
    torch.testing.assert_close(gqa, mha, rtol=0, atol=1e-12)


def test_module_wraps_the_function():
    config, n = CONFIGS["L2-p4-k8-m8"]
    q, k, v = random_qkv(1, n, 2, 2, 8, dtype=torch.float32)
    layer = LighthouseAttention(config)
    assert list(layer.parameters()) == []
    assert torch.equal(layer(q, k, v), lighthouse_attention(q, k, v, config))


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((1, 64, 4, 8), (1, 64, 3, 8), (1, 64, 3, 8)), "query heads H=4 must be a multiple of kv heads G=3"),
        (((1, 64, 4, 8), (1, 32, 2, 8), (1, 32, 2, 8)), "must agree on batch, sequence and head dim"),
        (((1, 64, 4, 8), (1, 64, 2, 8), (1, 64, 2, 4)), "must have the same shape"),
        (((64, 4, 8), (64, 2, 8), (64, 2, 8)), "must be 4-D"),
    ],
)
def test_mismatched_inputs_are_rejected_by_name(shapes, message):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        lighthouse_attention(q, k, v, LighthouseConfig(levels=2, pool=2, topk=4, tile_budget=2, selection="paper"))


@pytest.mark.parametrize(
    "device, dtype, expected",
    [("cpu", torch.float32, "flash"), ("cpu", torch.float64, "flash"), ("cuda", torch.bfloat16, "cudnn"),
     ("cuda", torch.float16, "cudnn"), ("cuda", torch.float32, "efficient")],
)
def test_auto_backend_is_cudnn_on_cuda_where_cudnn_has_kernels_and_flash_on_cpu(device, dtype, expected):
    from lighthouse.attention import resolve_backend

    assert resolve_backend("auto", torch.device(device), dtype) == expected
    assert resolve_backend("flash", torch.device(device), dtype) == "flash"
