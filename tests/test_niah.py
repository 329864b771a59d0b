"""The NIAH harness: prompts of exact length with the needle at the asked depth, and honest scoring."""
import random

import pytest
import torch

from eval.niah import DEPTHS, NEEDLE, build_prompt, plot_heatmap, run_niah


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


@pytest.mark.parametrize("depth", DEPTHS)
def test_prompt_has_the_asked_length_and_puts_the_needle_at_the_depth(depth):
    length = 400
    ids = build_prompt(encode, length, depth, digit=7, rng=random.Random(1))
    assert len(ids) == length
    text = bytes(ids).decode()
    needle_at = text.index(NEEDLE.format(digit=7))
    filler_len = length - len(encode(NEEDLE.format(digit=7))) - len(encode(" What is the passkey? The passkey is "))
    assert needle_at == filler_len * depth // 100
    assert text.endswith("The passkey is ")


def test_too_short_a_context_is_rejected():
    with pytest.raises(ValueError, match="length=10 is shorter than the needle"):
        build_prompt(encode, 10, 50, 3, random.Random(0))


def _digit_after_passkey(ids: torch.Tensor) -> int:
    text = bytes(ids[0].tolist()).decode()
    return int(text[text.index("passkey is ") + len("passkey is ")])


def test_a_model_that_reads_the_needle_scores_one_and_a_constant_model_scores_a_tenth(tmp_path):
    vocab = 258

    def oracle(ids):
        logits = torch.randn(1, ids.shape[1], vocab)
        logits[0, -1, ord(str(_digit_after_passkey(ids)))] = 100.0
        return logits

    def always_zero(ids):
        logits = torch.zeros(1, ids.shape[1], vocab)
        logits[0, -1, ord("0")] = 1.0
        return logits

    lengths = [128, 256]
    perfect = run_niah(oracle, encode, lengths, seed=3)
    constant = run_niah(always_zero, encode, lengths, seed=3)
    assert perfect.mean == 1.0
    assert constant.accuracy == [[0.1] * len(DEPTHS)] * len(lengths)
    plot_heatmap(perfect, str(tmp_path / "niah.png"), "oracle")
    assert (tmp_path / "niah.png").stat().st_size > 0
