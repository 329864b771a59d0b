"""SPEC section 3, selection modes: "causal" scores read no token after the entry's first token, "paper" does.

The leak this closes: under "paper" an entry's expansion score is the max over its whole window, so whether
position j receives the fine entries of its window depends on tokens after j, and a trained model learns to
read that (docs/causality.md).
"""
import dataclasses

import pytest
import torch

from lighthouse import LighthouseConfig, lighthouse_attention, pyramid_scores, select, token_scores

from .helpers import random_qkv, vectors_with_norms

NORM = LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="causal")
DILATED = dataclasses.replace(NORM, scorer="dilated", dilation=2)


@pytest.mark.parametrize("with_history", [False, True], ids=["sequence-start", "shard-with-history"])
@pytest.mark.parametrize("pool, levels, n", [(2, 3, 64), (4, 3, 256), (2, 5, 256)])
def test_causal_entry_scores_the_tokens_ending_at_its_first_token(pool, levels, n, with_history):
    s = torch.rand(2, 3, n)
    halo = pool ** (levels - 1) - 1
    history = torch.rand(2, 3, halo) if with_history else None
    extended = torch.cat([history if with_history else torch.full((2, 3, halo), float("-inf")), s], dim=-1)
    got = pyramid_scores(s, pool, levels, "causal", history)
    assert torch.equal(got[0], s)
    for lvl in range(1, levels):
        span = pool**lvl
        for i in range(n // span):
            first = i * span  # window [first - span + 1, first], clipped at the start (or read from history)
            want = extended[..., halo + max(first - span + 1, -halo) : halo + first + 1].amax(-1)
            assert torch.equal(got[lvl][..., i], want), f"level {lvl} entry {i}"


def test_paper_entry_scores_its_own_window():
    s = torch.rand(2, 3, 64)
    got = pyramid_scores(s, 4, 3, "paper")
    assert torch.equal(got[1], s.view(2, 3, 16, 4).amax(-1))
    assert torch.equal(got[2], s.view(2, 3, 4, 16).amax(-1))


def _scores(q, k, v, config):
    return [torch.cat(pyramid_scores(s, config.pool, config.levels, config.selection), -1)
            for s in token_scores(q, k, v, config)]


def _entries_starting_at_or_before(j: int, n: int, config) -> torch.Tensor:
    """Mask over the concatenated levels: entries whose first token is <= j."""
    return torch.cat([torch.arange(n // config.pool**lvl) * config.pool**lvl <= j for lvl in range(config.levels)])


@pytest.mark.parametrize("config", [NORM, DILATED], ids=["norm", "dilated"])
def test_causal_scores_of_entries_starting_at_or_before_j_ignore_every_input_after_j(config):
    n = 256
    q, k, v = random_qkv(2, n, 4, 2, 8)
    span = config.coarsest_span
    # j inside a coarsest window, not at its end: the paper's window maxima then reach past j
    for j in (span * torch.randint(0, n // span, (4,)) + torch.randint(0, span - 1, (4,))).tolist():
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[:, j + 1 :] = torch.randn_like(x[:, j + 1 :]) * 3
        seen = _entries_starting_at_or_before(j, n, config)
        for name, before, after in zip(("sQ", "sK"), _scores(q, k, v, config), _scores(q2, k2, v2, config)):
            assert torch.equal(before[..., seen], after[..., seen]), f"{name} of an entry starting <= j={j} moved"
        paper = dataclasses.replace(config, selection="paper")
        leaked = [not torch.equal(b[..., seen], a[..., seen])
                  for b, a in zip(_scores(q, k, v, paper), _scores(q2, k2, v2, paper))]
        assert any(leaked), f"paper scores of entries starting <= j={j} should read tokens after j"


def test_paper_selection_leaks_a_later_token_into_an_earlier_output():
    # L=2, p=2, one tile, m=2: token 0's entry takes the sQ slot, the sK slot goes to the highest key norm.
    # All key norms are 1 except one token after j: raising its norm makes the paper score of the entry
    # holding j the largest, which expands that entry and gathers token j itself, so o[j] changes.
    config = LighthouseConfig(levels=2, pool=2, topk=2, tile_budget=2, selection="paper")
    n, j = 32, 10  # entry 5 covers tokens 10 and 11
    # one random direction per head, repeated over the tokens: norms tie exactly (ties go to the lower position)
    q, k = (vectors_with_norms(torch.ones(1, 1, 2, dtype=torch.float64), 8).expand(1, n, 2, 8).clone()
            for _ in range(2))
    v = torch.randn(1, n, 2, 8, dtype=torch.float64)
    k_later = k.clone()
    k_later[:, j + 1] *= 5
    for selection, moves in (("paper", True), ("causal", None)):
        cfg = dataclasses.replace(config, selection=selection)
        before, after = select(q, k, cfg, v=v), select(q, k_later, cfg, v=v)
        j_gathered = ((after.level == 0) & (after.index == j)).any().item()
        if selection == "paper":
            assert j_gathered and not ((before.level == 0) & (before.index == j)).any().item()
            o, o_later = lighthouse_attention(q, k, v, cfg), lighthouse_attention(q, k_later, v, cfg)
            assert not torch.allclose(o[:, j], o_later[:, j]), "paper selection should move o[j]"
        else:
            assert not j_gathered, "causal selection must not expand j's entry for a token after j"


def test_causal_selection_is_the_default_and_the_recipe_takes_it_from_the_layer():
    from recipe.train.job_config import Lighthouse

    q, k, v = random_qkv(2, 256, 4, 2, 8)
    default = LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2)
    causal = dataclasses.replace(default, selection="causal")
    a, b = select(q, k, default), select(q, k, causal)
    assert default.selection == "causal" == Lighthouse().selection
    assert torch.equal(a.index, b.index) and torch.equal(a.level, b.level)


def test_unknown_selection_is_rejected_naming_the_value():
    with pytest.raises(ValueError, match=r"selection='strictest' is not one of \('paper', 'causal', 'strict'\)"):
        LighthouseConfig(levels=3, pool=2, topk=4, tile_budget=2, selection="strictest").check()
