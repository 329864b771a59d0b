"""Per-document held-out loss (eval.metrics.heldout, scripts/heldout_loss.py --documents): the windows are lm-eval's
rolling windows, so the score is lm-eval's rolling log-likelihood (tests/test_lm_eval_export.py compares the
numbers on an export)."""
from __future__ import annotations

import json
import random

import pytest
import torch

from eval.metrics.heldout import document_loss, heldout_documents, rolling_windows

lm_eval_utils = pytest.importorskip("lm_eval.utils")

PREFIX = 256


@pytest.mark.parametrize("seq_len", [1, 4, 7, 16])
def test_the_rolling_windows_are_lm_evals_disjoint_windows(seq_len):
    for length in [0, 1, seq_len - 1, seq_len, seq_len + 1, 2 * seq_len, 3 * seq_len + 2, random.randrange(1, 99)]:
        tokens = [random.randrange(256) for _ in range(max(length, 0))]
        theirs = [lm_eval_utils.make_disjoint_window(pair) for pair in
                  lm_eval_utils.get_rolling_token_windows(tokens, PREFIX, seq_len, 1)]
        ours = rolling_windows(tokens, PREFIX, seq_len)
        assert len(ours) == len(theirs)
        for (ids, scored), (context, continuation) in zip(ours, theirs):
            assert ids == (context + continuation)[-(seq_len + 1):]  # what lm-eval's HF model runs
            assert scored == len(continuation) and ids[-scored:] == continuation
        assert sum(scored for _, scored in ours) == len(tokens)


def test_the_document_loss_is_the_mean_over_bytes_of_every_windows_predicted_bytes():
    torch.manual_seed(random.randrange(2**31))
    table = torch.randn(257, 257)

    def logits_fn(ids: torch.Tensor) -> torch.Tensor:  # a bigram model: the loss of a byte depends on the one before
        return table[ids]

    texts = ["x" * 10, "Grüße " * 7]
    nats, count = document_loss(logits_fn, texts, seq_len=8)
    # each byte's loss under the bigram table, read off the table itself: -log p(byte | the byte before)
    log_p = table.double().log_softmax(-1)
    expected = [-log_p[prev, nxt] for text in texts
                for prev, nxt in zip([PREFIX, *text.encode("utf-8")], text.encode("utf-8"))]
    assert count == sum(len(t.encode("utf-8")) for t in texts)
    assert nats == pytest.approx(torch.stack(expected).mean().item(), rel=1e-6)


def test_documents_are_read_in_order_and_too_few_are_named(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["one", "", "two", "three"]))
    assert heldout_documents(str(tmp_path / "*.jsonl"), 3) == ["one", "two", "three"]
    with pytest.raises(ValueError, match="holds 3 non-empty documents, fewer than --documents=4"):
        heldout_documents(str(tmp_path / "*.jsonl"), 4)
