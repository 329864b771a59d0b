"""SPEC section 3-4: the tile descent, its tie-breaking, the prefix guarantee and the gather order."""
import pytest
import torch

from lighthouse import LighthouseConfig, select

from .helpers import random_qkv, vectors_with_norms


def _one_row_inputs(sq: list[float], sk: list[float], dim: int = 4):
    """q, k of shape [1, N, 1, dim] whose per-token norms are exactly the given scores."""
    q = vectors_with_norms(torch.tensor(sq, dtype=torch.float64), dim).view(1, -1, 1, dim)
    k = vectors_with_norms(torch.tensor(sk, dtype=torch.float64), dim).view(1, -1, 1, dim)
    return q, k


def test_hand_worked_example_N32_p2_L3_k4_m2():
    # Two tiles of 4 coarsest entries (4 tokens each). sQ is 1 except tokens 21 (5) and 30 (4);
    # sK is 1 except tokens 13 (7), 22 (3) and 25 (6).
    sq = [1.0] * 32
    sq[21], sq[30] = 5.0, 4.0
    sk = [1.0] * 32
    sk[13], sk[22], sk[25] = 7.0, 3.0, 6.0
    q, k = _one_row_inputs(sq, sk)
    sel = select(q, k, LighthouseConfig(levels=3, pool=2, topk=4, tile_budget=2, selection="paper"))
    # Tile 0, level 2: entry 0 forced (prefix guarantee, the sQ slot), entry 3 by sK (token 13).
    #   level 1: children {0,1,6,7}; 0 forced, 6 by sK (tokens 12,13); level 0: children {0,1,12,13}.
    # Tile 1, level 2: entry 5 by sQ (token 21), then entry 6 by sK (token 25).
    #   level 1: children {10,11,12,13}; 10 by sQ (token 21), 12 by sK (token 25) over 11 (token 22);
    #   level 0: children {20,21,24,25}.
    # Order: leaf at start*(L+1), expanded entry at end*(L+1)+level.
    expected_level = [0, 0, 1, 1, 2, 2, 2, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 0, 0, 1, 1, 2, 2]
    expected_index = [0, 1, 0, 1, 0, 1, 2, 12, 13, 6, 7, 3, 4, 20, 21, 10, 11, 5, 24, 25, 12, 13, 6, 7]
    expected_expanded = [0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0]
    assert sel.level[0, 0].tolist() == expected_level
    assert sel.index[0, 0].tolist() == expected_index
    assert sel.expanded[0, 0].int().tolist() == expected_expanded


@pytest.mark.parametrize("levels, pool, topk, budget, n", [(3, 2, 8, 4, 128), (2, 4, 8, 8, 256), (4, 2, 4, 4, 256)])
def test_equal_scores_select_the_lowest_positions(levels, pool, topk, budget, n):
    # Random signed one-hot rows: every norm is exactly 1, so every comparison is a tie.
    axis = torch.randint(0, 4, (2, n, 2))
    sign = torch.randint(0, 2, (2, n, 2)).to(torch.float64) * 2 - 1
    q = torch.nn.functional.one_hot(axis, 4).to(torch.float64) * sign.unsqueeze(-1)
    k = q.flip(1)
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection="paper")
    sel = select(q, k, config)
    # With all ties, each level expands the `budget` lowest candidates of every tile, so the expanded
    # chain of a tile is the prefix of its coarsest range, refined level by level.
    tiles, per_tile = config.num_tiles, n // pool ** (levels - 1) // config.num_tiles
    for lvl in range(1, levels):
        got = sel.index[sel.expanded & (sel.level == lvl)].view(2, 2, tiles, budget)
        tile_start = torch.arange(tiles) * per_tile * pool ** (levels - 1 - lvl)
        expected = tile_start.view(tiles, 1) + torch.arange(budget)
        assert torch.equal(got.sort(-1).values, expected.expand_as(got))


def _coverage(sel, config, n):
    """(leaf coverage count, scatter contribution count) per base position, counted from the ranges."""
    span = config.pool**sel.level
    start = sel.index * span
    leaf_count = torch.zeros(*sel.level.shape[:2], n + 1, dtype=torch.int64)
    contrib = torch.zeros_like(leaf_count)
    leaf = ~sel.expanded
    # Difference arrays: +1 at the first covered position, -1 past the last one.
    leaf_count.scatter_add_(-1, start, leaf.long())
    leaf_count.scatter_add_(-1, start + span, -leaf.long())
    r_lo = (start + span - 1).clamp(max=n)
    r_hi = (start + 2 * span - 1).clamp(max=n)
    contrib.scatter_add_(-1, r_lo, torch.ones_like(r_lo))
    contrib.scatter_add_(-1, r_hi, -torch.ones_like(r_hi))
    return leaf_count.cumsum(-1)[..., :n], contrib.cumsum(-1)[..., :n]


GEOMETRIES = [(64, 2, 2, 4, 2), (128, 2, 3, 8, 4), (256, 4, 3, 8, 4), (256, 2, 4, 4, 2), (512, 8, 2, 16, 8),
              (1024, 2, 5, 16, 4)]


@pytest.mark.parametrize("n, p, levels, k, m", GEOMETRIES, ids=["N{}-p{}-L{}-k{}-m{}".format(*g) for g in GEOMETRIES])
def test_leaves_partition_the_sequence_and_every_position_gets_1_to_L_contributions(n, p, levels, k, m):
    config = LighthouseConfig(levels=levels, pool=p, topk=k, tile_budget=m, selection="paper")
    q, k_, _ = random_qkv(2, n, 4, 2, 8)
    sel = select(q, k_, config)
    leaves, contributions = _coverage(sel, config, n)
    assert torch.equal(leaves, torch.ones_like(leaves))
    assert contributions.min() >= 1 and contributions.max() <= levels
    # The prefix guarantee: token 0's chain is expanded at every level above 0.
    for lvl in range(1, levels):
        assert (sel.expanded & (sel.level == lvl) & (sel.index == 0)).any(-1).all()


@pytest.mark.parametrize("levels, pool, topk, budget, n", [(3, 2, 8, 4, 128), (3, 4, 16, 8, 512)])
def test_each_tile_expands_budget_entries_per_level_and_gathers_their_children(levels, pool, topk, budget, n):
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection="paper")
    q, k, _ = random_qkv(1, n, 2, 2, 8)
    sel = select(q, k, config)
    for row in range(2):
        level, index, expanded = sel.level[0, row], sel.index[0, row], sel.expanded[0, row]
        entries = set(zip(level.tolist(), index.tolist()))
        for lvl in range(1, levels):
            chosen = index[expanded & (level == lvl)]
            assert chosen.numel() == config.num_tiles * budget
            for i in chosen.tolist():
                assert all((lvl - 1, i * pool + c) in entries for c in range(pool))
        # Entries appear once, and the gather order is the sort-key order (strictly increasing keys).
        assert len(entries) == level.numel()
        span = pool**level
        key = torch.where(expanded, (index + 1) * span - 1, index * span) * (levels + 1) + expanded * level
        assert (key[1:] > key[:-1]).all()


def test_gqa_query_score_is_the_max_over_the_group():
    # Two query heads per kv head: selecting with both equals selecting with their per-token max norm.
    q, k, _ = random_qkv(1, 128, 4, 2, 8)
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="paper")
    sel = select(q, k, config)
    norms = torch.linalg.vector_norm(q, dim=-1).view(1, 128, 2, 2)
    winner = norms.argmax(-1, keepdim=True)
    q_max = torch.gather(q.view(1, 128, 2, 2, 8), 3, winner.unsqueeze(-1).expand(-1, -1, -1, -1, 8)).squeeze(3)
    sel_max = select(q_max, k, config)
    assert torch.equal(sel.index, sel_max.index) and torch.equal(sel.level, sel_max.level)
