"""eval.metrics.causality: the audit measures the loss a model owes to inputs after the block it predicts."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eval.checkpoint import build_model, parse_job_config
from eval.metrics.causality import causality_audit, sample_positions

VOCAB, SEQ_LEN = 258, 128


def _windows(count: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (count, SEQ_LEN + 1))


def test_dense_attention_owes_exactly_nothing_to_the_future():
    job = parse_job_config(["--job.config_file", "configs/debug.toml", "--lighthouse.no-enable",
                            "--training.seq_len", str(SEQ_LEN)])
    torch.manual_seed(0)
    model = build_model(job, torch.device("cpu"))
    results = causality_audit(model, _windows(), [1, 4, 16], samples=6, seed=1, batch_size=3)
    assert [r.lookahead for r in results] == [1, 4, 16]
    for r in results:
        assert r.samples == 6
        assert r.delta == 0.0 and r.honest_loss == r.seen_loss, r
        assert r.seen_loss > 1.0  # a real loss was computed


def _peeking_logits(ids: torch.Tensor) -> torch.Tensor:
    """A model that predicts each label by reading the next input (the label itself), the leak at its worst."""
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
    return 20.0 * F.one_hot(nxt, VOCAB).float()


def test_a_model_that_reads_the_next_input_owes_it_the_last_token_of_each_block():
    # window w is a shift of one random sequence by w: a replacement token never equals the true one
    windows = (torch.randint(0, VOCAB, (1, SEQ_LEN + 1)) + torch.arange(4)[:, None]) % VOCAB
    results = causality_audit(_peeking_logits, windows, [1, 4, 16], samples=8, seed=0)
    deltas = [r.delta for r in results]
    assert all(d > 1.0 for d in deltas), deltas
    # only the block's last position reads a replaced input: the leak per token shrinks as 1/b
    assert deltas[0] == pytest.approx(4 * deltas[1], rel=1e-6) == pytest.approx(16 * deltas[2], rel=1e-6)
    # every sampled block owes the same leak, so the samples' standard error is zero up to rounding
    assert all(0 <= r.stderr < 1e-6 * r.delta for r in results), [r.stderr for r in results]


def test_positions_are_drawn_once_from_the_seed_inside_the_window():
    a = sample_positions(windows=5, seq_len=1024, samples=50, max_lookahead=256, seed=3)
    assert a == sample_positions(windows=5, seq_len=1024, samples=50, max_lookahead=256, seed=3)
    assert a != sample_positions(windows=5, seq_len=1024, samples=50, max_lookahead=256, seed=4)
    assert all(0 <= w < 5 and 1024 // 16 <= c <= 1024 - 256 for w, c in a)


@pytest.mark.parametrize("kwargs, message", [
    (dict(windows=1, seq_len=64, samples=4, max_lookahead=4, seed=0), "at least 2 windows"),
    (dict(windows=2, seq_len=64, samples=4, max_lookahead=64, seed=0), "lookahead 64 leaves no position"),
])
def test_impossible_samples_are_rejected_naming_the_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sample_positions(**kwargs)
