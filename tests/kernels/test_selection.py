"""The tile-selection kernel picks exactly what `lighthouse.descend` picks: same entries, same order."""
import pytest
import torch

pytest.importorskip("triton")

from lighthouse import LighthouseConfig, descend, pyramid_index, pyramid_scores, token_scores
from lighthouse import select as reference_select
from lighthouse.fused import score_pyramid, select_gather_order, selection_of
from ..helpers import DEVICE, random_qkv

from lighthouse_kernels.selection import select_order

# (levels, pool, topk, tile_budget, seq_len): several tiles, deep and shallow pyramids, m from 2 to 16,
# coarsest tiles that are and are not a multiple of m
CONFIGS = [
    (3, 4, 32, 8, 512),
    (3, 2, 16, 2, 64),
    (2, 4, 16, 4, 128),
    (4, 2, 32, 16, 1024),
    (3, 4, 24, 8, 768),
    (2, 2, 8, 8, 160),
]
CONFIG_IDS = [f"L{c[0]}-p{c[1]}-k{c[2]}-m{c[3]}-N{c[4]}" for c in CONFIGS]


def _score_pyramids(shape, seq_len, config, ties):
    """Score pyramids of fresh random token scores, pooled as `config.selection` says; `ties` draws from 3
    values only."""
    def one():
        s = torch.rand(*shape, seq_len, device=DEVICE)
        return pyramid_scores((s * 3).floor() if ties else s, config.pool, config.levels, config.selection)
    return one(), one()


def _assert_same_selection(fast, ref):
    assert torch.equal(fast.level, ref.level), "levels differ"
    assert torch.equal(fast.index, ref.index), "indices differ"
    assert torch.equal(fast.expanded, ref.expanded), "expanded flags differ"


# Every pair of the three axes: each config with both rules and with both kinds of scores (distinct, ties), each
# rule with both kinds of scores (12 of the 24 combinations; which kind a rule takes alternates from config to
# config).
DESCENT_CASES = [
    pytest.param(*config, ties, selection, id=f"{config_id}-{'ties' if ties else 'distinct'}-{rule_id}")
    for i, (config, config_id) in enumerate(zip(CONFIGS, CONFIG_IDS))
    for ties, selection, rule_id in (((i % 2 == 1), "paper", "ranking"), ((i % 2 == 0), "strict", "strict-online"))
]


@pytest.mark.parametrize("levels, pool, topk, budget, n, ties, selection", DESCENT_CASES)
def test_kernel_descent_equals_reference(levels, pool, topk, budget, n, ties, selection):
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection=selection)
    sq, sk = _score_pyramids((1, 1), n, config, ties)  # one row (the GQA, prefix and inverse map tests take several)
    order = select_gather_order(torch.cat(sq, -1), torch.cat(sk, -1), n, config)
    _assert_same_selection(selection_of(order.packed, config), descend(sq, sk, config))


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix", "shard"])
def test_prefix_guarantee_follows_the_flag(prefix):
    # Token 0 scores lowest everywhere: only the prefix guarantee can expand its chain.
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="paper")
    n = 128
    sq, sk = _score_pyramids((2, 1), n, config, ties=False)
    for s in sq + sk:
        s[..., 0] = -1.0
    order = select_gather_order(torch.cat(sq, -1), torch.cat(sk, -1), n, config, prefix=prefix)
    fast = selection_of(order.packed, config)
    _assert_same_selection(fast, descend(sq, sk, config, prefix=prefix))
    token0_chain_expanded = fast.expanded & (fast.index == 0) & (fast.level > 0)
    assert token0_chain_expanded.sum().item() == (2 * (config.levels - 1) if prefix else 0)


@pytest.mark.parametrize("selection", ["paper", "causal", "strict"])
@pytest.mark.parametrize("scorer", ["norm", "dilated"])
def test_kernel_descent_on_qkv_scores_with_gqa_equals_reference(scorer, selection):
    config = LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=8, scorer=scorer, dilation=2, selection=selection)
    q, k, v = random_qkv(1, 256, 4, 2, 8, dtype=torch.float32, device=DEVICE)
    sq, sk = (score_pyramid(s, config) for s in token_scores(q, k, v, config))
    fast = selection_of(select_gather_order(sq, sk, q.shape[1], config).packed, config)
    _assert_same_selection(fast, reference_select(q, k, config, v=v))


def test_float64_scores_are_rejected():
    config = LighthouseConfig(levels=2, pool=2, topk=4, tile_budget=4, selection="paper")
    s = torch.rand(1, 1, 48, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="float32 scores; got sq torch.float64"):
        select_order(s, s, 32, config.pool, config.levels, config.topk, config.tile_budget)


@pytest.mark.parametrize("levels, pool, topk, budget, n", CONFIGS, ids=CONFIG_IDS)
def test_inverse_map_holds_each_gathered_entry_slot_and_minus_one_elsewhere(levels, pool, topk, budget, n):
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection="paper")
    sq, sk = _score_pyramids((1, 2), n, config, ties=False)
    order = select_gather_order(torch.cat(sq, -1), torch.cat(sk, -1), n, config)
    flat = pyramid_index(selection_of(order.packed, config), n, pool, levels)
    expected = torch.full_like(order.slots, -1)
    expected.scatter_(-1, flat,
                      torch.arange(flat.shape[-1], dtype=torch.int32, device=DEVICE).expand_as(flat).contiguous())
    assert (expected >= 0).sum() == flat.numel()  # every entry gathered once
    assert torch.equal(order.slots, expected)


def test_int64_keys_give_the_same_order_and_inverse_map():
    config = LighthouseConfig(levels=3, pool=4, topk=32, tile_budget=8, selection="paper")
    sq, sk = (torch.cat(s, -1) for s in _score_pyramids((1, 1), 512, config, ties=True))
    args = (sq, sk, 512, config.pool, config.levels, config.topk, config.tile_budget)
    narrow, wide = select_order(*args), select_order(*args, key_dtype=torch.int64)
    assert narrow.packed.dtype == torch.int32 and wide.packed.dtype == torch.int64
    assert torch.equal(wide.packed, narrow.packed.long())
    assert torch.equal(wide.slots, narrow.slots)


@pytest.mark.parametrize("coarse_block", [8, 32], ids=lambda b: f"block{b}")
def test_coarsest_entries_ranked_in_several_blocks_or_one_padded_block_equal_reference(coarse_block):
    # 768 tokens, 2 tiles: 24 coarsest entries per tile, in 3 blocks of 8 or one block of 32 (8 padding)
    config = LighthouseConfig(levels=3, pool=4, topk=16, tile_budget=8, selection="paper")
    sq, sk = _score_pyramids((1, 2), 768, config, ties=False)
    order = select_order(torch.cat(sq, -1), torch.cat(sk, -1), 768, config.pool, config.levels, config.topk,
                         config.tile_budget, coarse_block=coarse_block)
    _assert_same_selection(selection_of(order.packed, config), descend(sq, sk, config))


def test_inverse_map_does_not_depend_on_what_its_memory_held(monkeypatch):
    # the kernel writes every entry of the map: -5 left behind would read as an expanded entry's mark
    config = LighthouseConfig(levels=3, pool=4, topk=32, tile_budget=8, selection="paper")
    sq, sk = (torch.cat(s, -1) for s in _score_pyramids((1, 1), 512, config, ties=False))
    args = (sq, sk, 512, config.pool, config.levels, config.topk, config.tile_budget)
    clean = select_order(*args)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *shape, **kw: empty(*shape, **kw).fill_(-5))
    poisoned = select_order(*args)
    assert torch.equal(poisoned.slots, clean.slots) and torch.equal(poisoned.packed, clean.packed)
    assert (clean.slots == -1).any()


@pytest.mark.parametrize("coarse_block", [8, 32], ids=lambda b: f"block{b}")
def test_kernel_strict_rule_carries_its_counts_and_window_across_coarsest_blocks(coarse_block):
    # 24 coarsest entries per tile, window 2*24/8 - 1 = 5: records and caps cross the blocks of 8;
    # NaN scores (counted as +inf) at a coarsest entry and at level 1
    config = LighthouseConfig(levels=3, pool=4, topk=16, tile_budget=8, selection="strict")
    sq, sk = _score_pyramids((1, 2), 768, config, ties=False)
    sq[1][0, 0, 5] = float("nan")
    for s in (sq, sk):
        s[2][..., 3] = float("nan")
    order = select_order(torch.cat(sq, -1), torch.cat(sk, -1), 768, config.pool, config.levels, config.topk,
                         config.tile_budget, coarse_block=coarse_block, strict=True)
    _assert_same_selection(selection_of(order.packed, config), descend(sq, sk, config))


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix", "shard"])
def test_kernel_strict_descent_ignores_the_prefix_flag_as_the_reference_does(prefix):
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="strict")
    sq, sk = _score_pyramids((2, 1), 128, config, ties=False)
    for s in sq + sk:
        s[..., 0] = -1.0
    order = select_gather_order(torch.cat(sq, -1), torch.cat(sk, -1), 128, config, prefix=prefix)
    _assert_same_selection(selection_of(order.packed, config), descend(sq, sk, config, prefix=True))
