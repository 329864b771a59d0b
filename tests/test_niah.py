"""The NIAH harness: prompts of exact length with the needle at the asked depth, and honest scoring."""
import random

import pytest
import torch

from eval.metrics.niah import (DEPTHS, NEEDLE, QUESTION, build_prompt, byte_encode, check_grid, markdown, plot_heatmap,
                               run_niah)


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


def test_the_table_has_a_row_per_model_with_its_mean_and_every_cell_and_a_dash_where_its_grid_lacks_one():
    rng = random.Random(5)
    scores = [[rng.randrange(11) / 10 for _ in range(2)] for _ in range(2)]
    full = {"lengths": [64, 128], "depths": [10, 90], "accuracy": scores,
            "mean": sum(map(sum, scores)) / 4}
    short = {"lengths": [64], "depths": [10, 90], "accuracy": [[0.1, 0.1]], "mean": 0.1}
    lines = markdown({"dense": full, "lighthouse": short}).splitlines()
    assert lines[2] == "| model | mean | 64 @ 10% | 64 @ 90% | 128 @ 10% | 128 @ 90% |"
    cells = [f"{a:.1f}" for row in scores for a in row]
    assert lines[4] == f"| dense | {full['mean']:.3f} | " + " | ".join(cells) + " |"
    assert lines[5] == "| lighthouse | 0.100 | 0.1 | 0.1 | - | - |"


def test_a_grid_is_checked_before_any_model_runs_and_the_shortest_length_builds_a_prompt():
    shortest = len(NEEDLE.format(digit=0)) + len(QUESTION)
    check_grid(byte_encode, [shortest, 4 * shortest], [0, 100])
    assert len(build_prompt(byte_encode, shortest, 50, 7, random.Random(0))) == shortest
    with pytest.raises(ValueError, match=rf"NIAH lengths \[{shortest - 1}\] are shorter .* \({shortest} tokens\)"):
        check_grid(byte_encode, [shortest - 1, 4 * shortest])
    with pytest.raises(ValueError, match=r"NIAH depths \[-5, 101\] must be percentages"):
        check_grid(byte_encode, [4 * shortest], [-5, 50, 101])
