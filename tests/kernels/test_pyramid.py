"""The fused pooling pass writes `pool_pyramid`'s levels and the norm-score pyramids of `lighthouse.scoring`."""
import pytest
import torch

pytest.importorskip("triton")

from lighthouse import norm_scores, pool_pyramid, pyramid_scores
from lighthouse.testing import assert_close
from ..helpers import DEVICE, KERNEL_DTYPES, random_qkv

from lighthouse_kernels.pyramid import causal_score_levels, pool_and_score, stored_levels

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


@pytest.mark.parametrize("stored", [0b100, 0b1100, 0b10100], ids=["coarsest", "levels-2-3", "levels-2-4"])
def test_writes_only_the_stored_levels(stored):
    n, pool, levels = 256, 2, 5 if stored >> 4 else 4 if stored >> 3 else 3
    q, k, v = random_qkv(1, n, 2, 1, 8, dtype=torch.float32, device=DEVICE)
    fused = pool_and_score(q, k, v, pool, levels, stored=stored)
    kept = [lvl for lvl in range(1, levels) if stored >> lvl & 1]
    ref = pool_pyramid(v, pool, levels)
    assert_close("stored v", torch.cat([ref[lvl] for lvl in kept], dim=1), fused.v, torch.float32)
    for name, s, fast in zip(("sq", "sk"), norm_scores(q, k), (fused.sq, fused.sk)):
        assert_close(name, torch.cat(pyramid_scores(s, pool, levels), dim=-1), fast, torch.float32)


@pytest.mark.parametrize("stored", [0b010, 0b101, 0b1100], ids=["coarsest-missing", "level-0", "past-the-top"])
def test_a_stored_mask_without_the_coarsest_or_outside_the_pooled_levels_is_refused(stored):
    q, k, v = random_qkv(1, 64, 2, 1, 8, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="coarsest level 2"):
        pool_and_score(q, k, v, pool=2, levels=3, stored=stored)


def test_intermediate_levels_are_recomputed_only_where_that_reads_no_more_than_storing_writes():
    # N=512K, L=3, p=4, k=2048: level 1 has 8192 gathered entries of 4 tokens against 131,072 entries
    assert stored_levels(524288, 4, 3, 4 * 2048) == 0b100
    # at k = N/64 the two are equal: recompute
    assert stored_levels(32768, 4, 3, 4 * 512) == 0b100
    # twice the budget reads more than storing writes: keep the level
    assert stored_levels(32768, 4, 3, 4 * 1024) == 0b110
    # L=4, p=4, k=2048 at 512K: level 2 (16 tokens per entry, 131,072 tokens) costs more than its 32,768 entries
    assert stored_levels(524288, 4, 4, 4 * 2048) == 0b1100
    assert stored_levels(524288, 4, 3) == 0b110  # no budget given: keep everything


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
