"""The fused pooling pass writes `pool_pyramid`'s levels and the norm-score pyramids of `lighthouse.scoring`."""
import pytest
import torch

pytest.importorskip("triton")

from lighthouse import norm_scores, pool_pyramid, pyramid_scores
from lighthouse.testing import assert_close
from tests.helpers import DEVICE, KERNEL_DTYPES, random_qkv

from .pyramid import causal_score_levels, pool_and_score

# (batch, seq_len, heads, kv_heads, dim, pool, levels)
SHAPES = [(2, 64, 4, 2, 16, 2, 3), (1, 128, 2, 2, 24, 4, 3), (1, 256, 3, 1, 8, 2, 5)]
SHAPE_IDS = [f"B{s[0]}-N{s[1]}-H{s[2]}-G{s[3]}-D{s[4]}-p{s[5]}-L{s[6]}" for s in SHAPES]


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("b, n, h, g, d, pool, levels", SHAPES, ids=SHAPE_IDS)
def test_levels_and_scores_equal_reference(b, n, h, g, d, pool, levels, dtype):
    q, k, v = random_qkv(b, n, h, g, d, dtype=dtype, device=DEVICE)
    fused = pool_and_score(q, k, v, pool, levels)
    for name, x, pooled in (("q", q, fused.q), ("k", k, fused.k), ("v", v, fused.v)):
        assert_close(f"pooled {name}", torch.cat(pool_pyramid(x, pool, levels)[1:], dim=1), pooled, dtype)
    for name, s, fast in zip(("sq", "sk"), norm_scores(q, k), (fused.sq, fused.sk)):
        ref = torch.cat(pyramid_scores(s, pool, levels), dim=-1)
        assert fast.dtype == torch.float32
        assert_close(name, ref, fast, torch.float32)


def test_without_scores_only_pools():
    q, k, v = random_qkv(1, 32, 2, 2, 8, dtype=torch.float32, device=DEVICE)
    fused = pool_and_score(q, k, v, pool=2, levels=2, scores=False)
    assert fused.sq.numel() == fused.sk.numel() == 0
    assert_close("pooled v", pool_pyramid(v, 2, 2)[1], fused.v, torch.float32)




@pytest.mark.parametrize("with_history", [False, True], ids=["sequence-start", "shard-with-history"])
@pytest.mark.parametrize("b, n, h, g, d, pool, levels", SHAPES, ids=SHAPE_IDS)
def test_causal_levels_equal_reference_bit_for_bit(b, n, h, g, d, pool, levels, with_history):
    s = [torch.rand(b, g, n, device=DEVICE) for _ in range(2)]
    halo = pool ** (levels - 1) - 1
    history = tuple(torch.rand(b, g, halo, device=DEVICE) for _ in range(2)) if with_history else (None, None)
    paper = [torch.cat(pyramid_scores(x, pool, levels), dim=-1) for x in s]
    fast = causal_score_levels(*(x.clone() for x in paper), n, pool, levels, history if with_history else None)
    for name, x, hist, got in zip(("sq", "sk"), s, history, fast):
        assert torch.equal(got, torch.cat(pyramid_scores(x, pool, levels, "causal", hist), dim=-1)), name
