"""eval/metrics/loss_anatomy.py: which tokens repeat their context earlier in the window, how far back, and what share
of a loss difference each class of tokens carries."""
from __future__ import annotations

import numpy as np
import pytest

from eval.metrics import loss_anatomy


def naive_previous(tokens: np.ndarray, n: int) -> np.ndarray:
    out = np.full(len(tokens), -1)
    for i in range(n - 1, len(tokens)):
        for j in range(i - 1, n - 2, -1):
            if np.array_equal(tokens[j - n + 1:j + 1], tokens[i - n + 1:i + 1]):
                out[i] = j
                break
    return out


@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_previous_occurrence_of_each_context_is_the_latest_earlier_one(n):
    rng = np.random.default_rng()
    tokens = rng.integers(0, 4, size=300).astype(np.uint16)   # a small alphabet repeats short contexts
    tokens[200:240] = tokens[20:60]                            # and a planted long repeat
    assert np.array_equal(loss_anatomy.previous_occurrence(tokens, n), naive_previous(tokens, n))


def test_a_copied_passage_is_repeated_far_back_and_copyable_and_fresh_text_is_not():
    rng = np.random.default_rng()
    window = rng.integers(0, 256, size=20001).astype(np.uint16)
    window[15000:15500] = window[1000:1500]                    # copied 14,000 tokens later
    classes = loss_anatomy.token_classes(window, 16)
    copied = slice(15016, 15499)                               # labels whose 16 preceding tokens lie in the copy
    assert classes["8K-131K"][copied].all() and classes["copyable"][copied].all()
    assert classes["fresh"][5000:6000].all()                   # random bytes: no 16-byte context repeats
    partition = sum(classes[name].astype(int) for name in ("fresh", "local <1K", "1K-8K", "8K-131K"))
    assert (partition == 1).all(), "fresh and the distance bins partition the tokens"


def test_the_shares_a_partition_carries_add_up_to_the_whole_difference():
    rng = np.random.default_rng()
    windows = rng.integers(0, 16, size=(2, 2049)).astype(np.uint16)
    low = rng.random((2, 2048)).astype(np.float32)
    high = low + rng.random((2, 2048)).astype(np.float32) * 0.2
    diff = loss_anatomy.difference({"a": high, "b": low}, windows, "a", "b")
    assert diff["total"] == pytest.approx(float((high - low).mean()), rel=1e-5)
    for partition in ("position", "ngram8", "ngram16", "ngram32 copyable"):
        assert sum(c["carried"] for c in diff[partition].values()) == pytest.approx(1.0)
        assert sum(c["tokens"] for c in diff[partition].values()) == pytest.approx(1.0)
    described = loss_anatomy.describe({"a": high, "b": low}, windows)
    assert described["models"]["a"] > described["models"]["b"]
    assert "| class | tokens |" in loss_anatomy.markdown([diff])


def test_stage_0s_length_becomes_a_position_edge_and_the_classes_still_partition_every_position():
    rng = np.random.default_rng()
    length = int(rng.integers(2, 40_000))
    stage0 = int(rng.integers(1, length))
    classes = loss_anatomy.position_classes(length, loss_anatomy.position_edges(stage0))
    covered = sum(mask.astype(int) for mask in classes.values())
    assert (covered == 1).all(), "every position in exactly one class"
    starts = [int(np.flatnonzero(mask)[0]) for mask in classes.values()]
    assert stage0 in starts, "a class starts at stage 0's length"
    assert sorted(starts) == [e for e in sorted({*loss_anatomy.POSITION_EDGES, stage0}) if e < length]
    past = sum(mask for mask, start in zip(classes.values(), starts) if start >= stage0)
    assert np.array_equal(past, np.arange(length) >= stage0), "the classes from it on are the positions past it"


def test_an_edge_already_among_the_position_edges_or_none_leaves_the_anatomy_as_it_was():
    rng = np.random.default_rng()
    for extra in (0, int(rng.choice(loss_anatomy.POSITION_EDGES))):
        assert loss_anatomy.position_edges(extra) == loss_anatomy.POSITION_EDGES
    windows = rng.integers(0, 16, size=(2, 2049)).astype(np.uint16)
    low = rng.random((2, 2048)).astype(np.float32)
    high = low + rng.random((2, 2048)).astype(np.float32) * 0.2
    assert loss_anatomy.difference({"a": high, "b": low}, windows, "a", "b", loss_anatomy.position_edges(1024)) == \
        loss_anatomy.difference({"a": high, "b": low}, windows, "a", "b")


def test_the_anatomy_splits_positions_at_the_edges_it_is_given():
    rng = np.random.default_rng()
    stage0 = int(rng.integers(2, 255))
    windows = rng.integers(0, 16, size=(2, 257)).astype(np.uint16)
    low = rng.random((2, 256)).astype(np.float32)
    high = low + rng.random((2, 256)).astype(np.float32)
    edges = loss_anatomy.position_edges(stage0)
    position = loss_anatomy.difference({"a": high, "b": low}, windows, "a", "b", edges)["position"]
    delta = high.astype(np.float64) - low
    assert list(position) == [f"0-{stage0}", f"{stage0}-256"]
    assert position[f"{stage0}-256"]["mean"] == pytest.approx(delta[:, stage0:].mean())
    described = loss_anatomy.describe({"a": high}, windows, edges)["position"]
    assert described[f"0-{stage0}"]["a"] == pytest.approx(high[:, :stage0].astype(np.float64).mean())
