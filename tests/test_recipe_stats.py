"""Lighthouse statistics computed from a Selection: S, expanded share per level, coverage evenness."""
import pytest
import torch

from lighthouse import LighthouseConfig, Selection, select
from recipe.logs.lighthouse_stats import SelectionStats, evenness_bins, selection_stats

from .helpers import random_qkv

CONFIGS = {
    "L3-p2-k16-m8": (LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=8, selection="paper"), 256),
    "L2-p4-k8-m4": (LighthouseConfig(levels=2, pool=4, topk=8, tile_budget=4, selection="paper"), 128),
    "L3-p2-dilated": (LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", selection="paper"),
                      128),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_stats_of_a_real_selection(name):
    config, n = CONFIGS[name]
    q, k, v = random_qkv(2, n, 4, 2, 8, dtype=torch.float32)
    stats = selection_stats(select(q, k, config, v=v), config, n)
    assert stats["S"].item() == config.gathered_len(n)
    for level in range(1, config.levels):
        # SPEC 3: every tile expands m entries per level, so k per (batch, kv-head) row.
        assert stats[f"expanded_share/l{level}"].item() == pytest.approx(config.topk / (n // config.pool**level))
        assert 0.0 < stats[f"evenness/l{level}"].item() <= 1.0
    assert set(stats) == {"S"} | {f"{s}/l{l}" for s in ("expanded_share", "evenness") for l in range(1, config.levels)}


def one_level_selection(expanded_index: list[int], entries: int) -> Selection:
    """A [1, 1, S] selection holding the given expanded level-1 entries plus every other level-1 entry as a leaf."""
    index = torch.arange(entries)
    expanded = torch.zeros(entries, dtype=torch.bool)
    expanded[expanded_index] = True
    return Selection(torch.ones(1, 1, entries, dtype=torch.long), index.view(1, 1, -1), expanded.view(1, 1, -1))


def test_evenness_is_one_when_expansions_fill_every_bin_and_zero_when_they_share_one():
    # 32 level-1 entries, 2 tiles
    config, n = LighthouseConfig(levels=2, pool=2, topk=8, tile_budget=4, selection="paper"), 64
    bins = evenness_bins(config, n, 1)
    entries = n // 2
    assert bins == 16
    width = entries // bins
    spread = [b * width + int(torch.randint(0, width, ())) for b in range(bins)]
    even = selection_stats(one_level_selection(spread, entries), config, n)
    assert even["evenness/l1"].item() == pytest.approx(1.0)
    assert even["expanded_share/l1"].item() == pytest.approx(bins / entries)
    start = int(torch.randint(0, bins, ())) * width
    collapsed = selection_stats(one_level_selection([start, start + 1], entries), config, n)
    assert collapsed["evenness/l1"].item() == pytest.approx(0.0, abs=1e-12)


def test_summary_averages_calls_per_layer_then_layers_and_reports_the_worst_layer():
    config, n = LighthouseConfig(levels=2, pool=2, topk=8, tile_budget=4, selection="paper"), 64
    stats = SelectionStats()
    layer_a, layer_b = stats.observer("layers.1.attention", config), stats.observer("layers.2.attention", config)
    q, k, v = random_qkv(1, n, 2, 2, 8, dtype=torch.float32)
    layer_a(q, k, v)
    layer_a(q, k, v)  # activation recomputation repeats a call; the mean is unchanged
    q2, k2, v2 = random_qkv(1, n, 2, 2, 8, dtype=torch.float32)
    layer_b(q2, k2, v2)
    a = selection_stats(select(q, k, config), config, n)["evenness/l1"].item()
    b = selection_stats(select(q2, k2, config), config, n)["evenness/l1"].item()
    summary = stats.summarize()
    assert summary["lighthouse/S"] == config.gathered_len(n)
    assert summary["lighthouse/evenness/l1"] == pytest.approx((a + b) / 2)
    assert summary["lighthouse/evenness_min/l1"] == pytest.approx(min(a, b))
    assert stats.summarize() == {}  # reset after each log step
