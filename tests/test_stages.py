"""SPEC sections 1, 2 and 5, stage by stage, against naive loops."""
import math

import pytest
import torch

from lighthouse import (
    LighthouseConfig,
    dilated_scores,
    gather_subsequence,
    norm_scores,
    pool_pyramid,
    pyramid_index,
    pyramid_scores,
    scatter_back,
    select,
)

from .helpers import random_qkv


def test_pyramid_entries_are_means_over_their_base_windows():
    x, _, _ = random_qkv(2, 64, 3, 3, 5)
    for lvl, level in enumerate(pool_pyramid(x, pool=4, levels=3)):
        span = 4**lvl
        assert level.shape == (2, 64 // span, 3, 5)
        for i in range(64 // span):
            torch.testing.assert_close(level[:, i], x[:, i * span : (i + 1) * span].mean(1), rtol=0, atol=1e-14)


def test_norm_scores_take_the_group_max_then_max_pool_upward():
    q, k, _ = random_qkv(2, 32, 4, 2, 8)
    sq, sk = norm_scores(q, k)
    assert sq.dtype == sk.dtype == torch.float64 and sq.shape == (2, 2, 32)
    for g in range(2):
        torch.testing.assert_close(sq[:, g], q[:, :, 2 * g : 2 * g + 2].norm(dim=-1).amax(-1))
        torch.testing.assert_close(sk[:, g], k[:, :, g].norm(dim=-1))
    for lvl, level in enumerate(pyramid_scores(sq, pool=2, levels=4)):
        span = 2**lvl
        for i in range(32 // span):
            assert torch.equal(level[..., i], sq[..., i * span : (i + 1) * span].amax(-1))


def test_norm_scores_are_float32_for_bfloat16_inputs():
    q, k, _ = random_qkv(1, 16, 2, 2, 8, dtype=torch.bfloat16)
    sq, sk = norm_scores(q, k)
    assert sq.dtype == sk.dtype == torch.float32


def _naive_causal_attention_row_norm(queries, keys, values, t):
    """L2 norm of the causal softmax attention output of query row t (single head)."""
    logits = torch.stack([queries[t] @ keys[s] for s in range(t + 1)]) / math.sqrt(queries.shape[-1])
    weights = torch.softmax(logits, dim=0)
    return torch.linalg.vector_norm(sum(weights[s] * values[s] for s in range(t + 1)))


@pytest.mark.parametrize("dilation", [1, 2, 4])
def test_dilated_scorer_matches_a_naive_loop(dilation):
    heads, kv_heads, n = 4, 2, 16
    q, k, v = random_qkv(1, n, heads, kv_heads, 8)
    sq, sk = dilated_scores(q, k, v, dilation)
    expected_q = torch.zeros(1, heads, n, dtype=torch.float64)
    expected_k = torch.zeros_like(expected_q)
    for h in range(heads):
        g = h // (heads // kv_heads)
        for r in range(dilation):
            rows = list(range(r, n, dilation))
            qs, ks, vs = q[0, rows, h], k[0, rows, g], v[0, rows, g]
            for t, j in enumerate(rows):
                expected_q[0, h, j] = _naive_causal_attention_row_norm(qs, ks, vs, t)
                expected_k[0, h, j] = _naive_causal_attention_row_norm(ks, qs, vs, t)
    group_max = lambda s: s.view(1, kv_heads, heads // kv_heads, n).amax(2)  # noqa: E731
    torch.testing.assert_close(sq, group_max(expected_q))
    torch.testing.assert_close(sk, group_max(expected_k))


def test_dilated_scorer_is_selectable_and_changes_the_selection():
    q, k, v = random_qkv(1, 128, 2, 2, 8)
    norm = select(q, k, LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="paper"))
    dilated = select(q, k, LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated",
                                            selection="paper"), v=v)
    assert not torch.equal(norm.index, dilated.index)
    with pytest.raises(ValueError, match="scorer='dilated' needs v"):
        select(q, k, LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", selection="paper"))


def _naive_scatter(o_tilde, sel, n, pool, heads):
    out = torch.zeros(o_tilde.shape[0], n, heads, o_tilde.shape[-1], dtype=o_tilde.dtype)
    b_, g_, s_ = sel.level.shape
    for b in range(b_):
        for h in range(heads):
            g = h // (heads // g_)
            for s in range(s_):
                span = pool ** int(sel.level[b, g, s])
                lo = int(sel.index[b, g, s]) * span + span - 1
                out[b, lo : min(lo + span, n), h] += o_tilde[b, s, h]
    return out


@pytest.mark.parametrize("levels, pool, topk, budget, n", [(3, 2, 8, 4, 64), (2, 4, 8, 4, 128), (4, 2, 4, 2, 64)])
def test_scatter_back_sums_each_row_into_its_shifted_range(levels, pool, topk, budget, n):
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection="paper")
    q, k, _ = random_qkv(2, n, 4, 2, 3)
    sel = select(q, k, config)
    flat = pyramid_index(sel, n, pool, levels)
    o_tilde = torch.randn(2, sel.level.shape[-1], 4, 3, dtype=torch.float64, requires_grad=True)
    out = scatter_back(o_tilde, flat, n, pool, levels)
    torch.testing.assert_close(out, _naive_scatter(o_tilde.detach(), sel, n, pool, 4), rtol=0, atol=1e-13)
    # Backward: each row's gradient is the sum of the output gradient over its range.
    grad_out = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, o_tilde, grad_out)
    (expected,) = torch.autograd.grad(_naive_scatter(o_tilde, sel, n, pool, 4), o_tilde, grad_out)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-13)


def test_scatter_back_accumulates_in_float32_and_returns_the_input_dtype():
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="paper")
    q, k, _ = random_qkv(1, 64, 2, 2, 8)
    sel = select(q, k, config)
    flat = pyramid_index(sel, 64, 2, 3)
    o32 = torch.randn(1, sel.level.shape[-1], 2, 8)
    out16 = scatter_back(o32.bfloat16(), flat, 64, 2, 3)
    out32 = scatter_back(o32.bfloat16().float(), flat, 64, 2, 3)
    assert out16.dtype == torch.bfloat16
    assert torch.equal(out16, out32.bfloat16())


def test_gather_takes_each_selected_pyramid_row_for_every_head_of_its_group():
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="paper")
    q, k, _ = random_qkv(2, 64, 4, 2, 8)
    sel = select(q, k, config)
    pyramid = pool_pyramid(q, 2, 3)
    gathered = gather_subsequence(pyramid, pyramid_index(sel, 64, 2, 3))
    for b in range(2):
        for h in range(4):
            for s in range(0, sel.level.shape[-1], 7):
                lvl, idx = int(sel.level[b, h // 2, s]), int(sel.index[b, h // 2, s])
                assert torch.equal(gathered[b, s, h], pyramid[lvl][b, idx, h])


def test_scatter_back_can_keep_what_spills_past_the_end():
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="paper")
    q, k, _ = random_qkv(1, 64, 2, 2, 3)
    sel = select(q, k, config)
    flat = pyramid_index(sel, 64, 2, 3)
    o_tilde = torch.randn(1, sel.level.shape[-1], 2, 3, dtype=torch.float64, requires_grad=True)
    full = scatter_back(o_tilde, flat, 64, 2, 3, spill=True)
    assert full.shape[1] == 64 + 2**2 - 1
    torch.testing.assert_close(full[:, :64], scatter_back(o_tilde, flat, 64, 2, 3), rtol=0, atol=0)
    torch.testing.assert_close(full, _naive_scatter(o_tilde.detach(), sel, 64 + 3, 2, 2)[:, :67], rtol=0, atol=1e-13)
    assert torch.autograd.gradcheck(lambda o: scatter_back(o, flat, 64, 2, 3, spill=True), (o_tilde,))


def test_without_the_prefix_guarantee_a_shard_selects_by_score_alone():
    # Scores grow with position, so coarsest entry 0 scores lowest: only the prefix guarantee expands it.
    n = 64
    sq = torch.arange(n, dtype=torch.float64) + 1.0
    q = sq.view(1, n, 1, 1).expand(1, n, 1, 2).contiguous()
    k = q.clone()
    config = LighthouseConfig(levels=2, pool=2, topk=2, tile_budget=2, selection="paper")
    with_prefix, without = select(q, k, config), select(q, k, config, prefix=False)
    first = lambda s: bool((s.expanded & (s.level == 1) & (s.index == 0)).any())  # noqa: E731
    assert first(with_prefix) and not first(without)
