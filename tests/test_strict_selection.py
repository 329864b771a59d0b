"""SPEC section 3a, selection="strict": no output row, and no gradient of an earlier row, depends on a later
token, for any input; "causal" still leaks through the tile ranking, and the same probe shows it.

The probe (`eval.metrics.dependence`) replaces k and v at a later position j and compares, bit for bit in float64 on
the reference, every output row < j and the gradient of a loss on the rows < j with respect to q, k, v at
every row < j.
"""
import dataclasses

import pytest
import torch

from eval.metrics.dependence import reach
from lighthouse import LighthouseConfig, descend, pyramid_scores, select
from lighthouse.scoring import norm_scores
from lighthouse.selection import choose_expanded_online, online_window

from .helpers import REPO, random_qkv

# (name, config, N, query heads, kv heads): GQA and MHA, L = 2..4, p = 2..8, the norm and dilated scorers
PROBES = [
    ("L2-p8-gqa", LighthouseConfig(levels=2, pool=8, topk=4, tile_budget=2, selection="strict"), 64, 4, 2),
    ("L3-p4-gqa", LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="strict"), 256, 4, 2),
    ("L4-p2-mha", LighthouseConfig(levels=4, pool=2, topk=8, tile_budget=4, selection="strict"), 128, 2, 2),
    ("L3-p2-dilated-gqa", LighthouseConfig(levels=3, pool=2, topk=4, tile_budget=2, selection="strict",
                                           scorer="dilated", dilation=2), 64, 4, 1),
]
PROBE_IDS = [p[0] for p in PROBES]
PROBED_POSITIONS = 24


def _probe(config, n, heads, kv_heads, selection):
    q, k, v = random_qkv(2, n, heads, kv_heads, 8)
    positions = torch.randperm(n - 1)[:PROBED_POSITIONS].add(1).tolist()  # j >= 1: there is a row before it
    return reach(q, k, v, dataclasses.replace(config, selection=selection), positions)


@pytest.mark.parametrize("name, config, n, heads, kv_heads", PROBES, ids=PROBE_IDS)
def test_strict_no_earlier_output_or_gradient_moves_when_a_later_token_changes(name, config, n, heads, kv_heads):
    found = _probe(config, n, heads, kv_heads, "strict")
    assert found.leaking_positions == 0, f"strict selection: later tokens moved earlier rows: {found}"


@pytest.mark.parametrize("name, config, n, heads, kv_heads", PROBES, ids=PROBE_IDS)
def test_the_same_probe_finds_causal_selection_reading_later_tokens(name, config, n, heads, kv_heads):
    # the probe can fail: under "causal" the tile ranking carries later scores back (SPEC section 3a)
    found = _probe(config, n, heads, kv_heads, "causal")
    assert found.leaking_positions > 0 and found.output_rows > 0, f"the probe saw no causal leak: {found}"


def _online_by_hand(sq: list[float], sk: list[float], budget: int) -> list[bool]:
    """SPEC section 3a's rule for one tile, one candidate at a time."""
    n, half, window = len(sq), budget // 2, online_window(len(sq), budget)
    sq = [float("inf") if s != s else s for s in sq]
    sk = [float("inf") if s != s else s for s in sk]
    chosen, by_q, by_k = [False] * n, 0, 0
    for j in range(n):
        earlier = range(max(0, j - window), j)
        if sum(chosen) + (n - j) <= budget:
            chosen[j] = True  # as many candidates left as budget left
        if all(sq[j] > sq[i] for i in earlier) and by_q < half:
            chosen[j], by_q = True, by_q + 1
        elif all(sk[j] > sk[i] for i in earlier) and by_k < half:
            chosen[j], by_k = True, by_k + 1
    return chosen


@pytest.mark.parametrize("candidates, budget", [(8, 2), (16, 4), (24, 8), (9, 8)])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_strict_expands_the_online_records_then_the_tail_exactly_budget_per_tile(candidates, budget, ties):
    sq, sk = torch.rand(2, 3, 4, candidates), torch.rand(2, 3, 4, candidates)
    if ties:
        sq, sk = (sq * 3).floor(), (sk * 3).floor()
    sq[0, 0, 1, 2] = float("nan")
    sq[0, 0, 2, 0] = float("-inf")  # a tile's first candidate is a record whatever it scores
    got = choose_expanded_online(sq, sk, budget)
    assert (got.sum(-1) == budget).all() and got[..., 0].all()
    for b, g, t in torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(4)).tolist():
        want = _online_by_hand(sq[b, g, t].tolist(), sk[b, g, t].tolist(), budget)
        assert got[b, g, t].tolist() == want, f"tile ({b}, {g}, {t})"


def test_strict_decision_on_a_candidate_reads_no_later_candidate():
    sq, sk = torch.rand(1, 2, 3, 32), torch.rand(1, 2, 3, 32)
    before = choose_expanded_online(sq, sk, 8)
    for j in range(1, 32):
        sq2, sk2 = sq.clone(), sk.clone()
        sq2[..., j:], sk2[..., j:] = torch.rand_like(sq2[..., j:]) * 5, torch.rand_like(sk2[..., j:]) * 5
        after = choose_expanded_online(sq2, sk2, 8)
        assert torch.equal(before[..., :j], after[..., :j]), f"a candidate before {j} changed"


@pytest.mark.parametrize("levels, pool, topk, budget, n", [(3, 4, 8, 2, 256), (4, 2, 8, 4, 128), (2, 8, 4, 2, 64)])
def test_strict_gathers_as_many_entries_as_causal_and_its_leaves_partition_the_sequence(levels, pool, topk, budget, n):
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection="strict")
    q, k, _ = random_qkv(2, n, 4, 2, 8)
    sel = select(q, k, config)
    causal = select(q, k, dataclasses.replace(config, selection="causal"))
    assert sel.level.shape[-1] == config.gathered_len(n) == causal.level.shape[-1]
    covered = torch.zeros(2, 2, n, dtype=torch.int64)
    span = pool ** sel.level
    for offset in range(pool ** (levels - 1)):
        inside = ~sel.expanded & (offset < span)
        covered.scatter_add_(-1, (sel.index * span + offset).clamp(max=n - 1) * inside, inside.long())
    assert (covered == 1).all(), "leaves must cover every token exactly once"


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix", "shard"])
def test_strict_expands_the_first_chain_of_every_tile_so_token_0_gets_an_output(prefix):
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, selection="strict")
    q, k, _ = random_qkv(1, 128, 2, 2, 8)
    q[:, 0], k[:, 0] = 0.0, 0.0  # token 0 scores lowest
    sq, sk = (pyramid_scores(s, config.pool, config.levels, "strict") for s in norm_scores(q, k))
    sel = descend(sq, sk, config, prefix=prefix)
    tile_len = 128 // config.num_tiles
    for lvl in range(1, config.levels):
        firsts = torch.arange(config.num_tiles) * tile_len // config.pool**lvl
        expanded = sel.index[sel.expanded & (sel.level == lvl)].view(2, -1)
        assert all(torch.isin(firsts, row).all() for row in expanded), f"level {lvl}"


def test_the_recipe_takes_strict_from_the_toml_key_and_checks_it():
    from torchtitan.config import ConfigManager

    from recipe.train.trainer import check_job

    job = ConfigManager().parse_args(["--job.config_file", str(REPO / "configs" / "debug.toml"),
                                      "--lighthouse.selection", "strict"])
    check_job(job)
    assert job.lighthouse.selection == "strict"
