"""Causality audit: how much of a model's next-token loss comes from reading tokens it should not see.

For a sampled position c and lookahead b, the block [c, c + b) is scored twice: in the true window (`seen`),
and with every input at positions >= c + b replaced by another window's tokens at the same positions
(`honest`); the labels stay the true ones. A causal model gives the same loss both ways: its outputs at
positions < c + b read only inputs < c + b. Under the paper's selection an entry's expansion depends on
tokens after it, and a trained model learns to use that: `delta = honest - seen` > 0 is the loss the model
owes to the future. Dense attention gives exactly 0.

Every (window, c) sample is scored at every lookahead, so the lookaheads are paired. Samples are drawn with
a fixed seed before any model runs.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from eval.metrics.heldout import LogitsFn, token_losses
from recipe.progress import progress_bar

# The keys of a combined row (`combine_records`), besides the provenance it keeps.
ROW_KEYS = ("selection", "steps", "lookahead", "honest_loss", "seen_loss", "delta", "stderr", "samples")


@dataclass(frozen=True)
class LookaheadResult:
    """Mean block losses (nats per token) over all samples at one lookahead, and their paired difference."""

    lookahead: int
    honest_loss: float
    seen_loss: float
    delta: float
    stderr: float
    samples: int

    def as_dict(self) -> dict:
        return asdict(self)


def sample_range(seq_len: int, max_lookahead: int, min_context: int | None = None) -> tuple[int, int]:
    """The block starts c the audit draws from, [min_context, seq_len - max_lookahead] (default min_context:
    seq_len / 16, so every block has some context before it); ValueError when that holds none. The script checks
    its lookaheads with it before it loads a model."""
    low = seq_len // 16 if min_context is None else min_context
    high = seq_len - max_lookahead
    if high < low:
        raise ValueError(f"lookahead {max_lookahead} leaves no position to sample in a window of {seq_len} tokens "
                         f"(positions start at {low})")
    return low, high


def sample_positions(windows: int, seq_len: int, samples: int, max_lookahead: int, seed: int,
                     min_context: int | None = None) -> list[tuple[int, int]]:
    """`samples` (window, c) pairs, c uniform in `sample_range`."""
    if windows < 2:
        raise ValueError(f"the audit needs at least 2 windows (one lends the replacement tokens); got {windows}")
    low, high = sample_range(seq_len, max_lookahead, min_context)
    gen = torch.Generator().manual_seed(seed)
    which = torch.randint(0, windows, (samples,), generator=gen)
    where = torch.randint(low, high + 1, (samples,), generator=gen)
    return list(zip(which.tolist(), where.tolist()))


@torch.no_grad()
def causality_audit(logits_fn: LogitsFn, windows: torch.Tensor, lookaheads: list[int], samples: int, seed: int = 0,
                    batch_size: int = 4, progress: bool | None = None) -> list[LookaheadResult]:
    """Audit `logits_fn` on token windows [W, T + 1] (inputs are the first T, labels the last T).

    The replacement tokens of window w are window (w + 1) % W's, at the same positions. A progress bar over
    the forward passes when `progress` says so (recipe.progress).
    """
    if not lookaheads or min(lookaheads) < 1:
        raise ValueError(f"lookaheads={lookaheads} must be positive integers")
    count, seq_len = windows.shape[0], windows.shape[1] - 1
    inputs, labels = windows[:, :-1], windows[:, 1:]
    points = sample_positions(count, seq_len, samples, max(lookaheads), seed)

    rows = [(w, c, b) for w, c in points for b in lookaheads]
    bar = progress_bar(math.ceil(count / batch_size) + math.ceil(len(rows) / batch_size), "causality audit", progress)
    seen_batches = []
    for i in range(0, count, batch_size):
        seen_batches.append(token_losses(logits_fn, inputs[i:i + batch_size], labels[i:i + batch_size]))
        bar.update()
    seen = torch.cat(seen_batches)
    honest = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        ids = torch.stack([inputs[w] for w, _, _ in chunk]).clone()
        for r, (w, c, b) in enumerate(chunk):
            ids[r, c + b:] = inputs[(w + 1) % count, c + b:]
        losses = token_losses(logits_fn, ids, torch.stack([labels[w] for w, _, _ in chunk]))
        honest += [losses[r, c:c + b].mean().item() for r, (_, c, b) in enumerate(chunk)]
        bar.update()
    bar.close()

    results = []
    for i, b in enumerate(lookaheads):
        h = torch.tensor(honest[i::len(lookaheads)], dtype=torch.float64)
        s = torch.tensor([seen[w, c:c + b].mean().item() for w, c in points], dtype=torch.float64)
        d = h - s
        stderr = d.std(unbiased=True).item() / math.sqrt(len(d)) if len(d) > 1 else float("nan")
        results.append(LookaheadResult(b, h.mean().item(), s.mean().item(), d.mean().item(), stderr, len(d)))
    return results


def plot_audit(records: list[dict], path: str, title: str) -> None:
    """delta +- stderr against lookahead, one line per record ({"label": ..., "results": [LookaheadResult dicts]})."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for record in records:
        res = record["results"]
        ax.errorbar([r["lookahead"] for r in res], [r["delta"] for r in res], yerr=[r["stderr"] for r in res],
                    marker="o", capsize=3, label=record["label"])
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("lookahead b (tokens of the block scored)")
    ax.set_ylabel("loss with future replaced - loss with true future (nats)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def checkpoint_steps(path: str | Path) -> int | None:
    """N of a step folder named step-N, else None."""
    match = re.fullmatch(r"step-(\d+)", Path(path).name)
    return int(match.group(1)) if match else None


def record_label(record: dict) -> str:
    """The plot label of an audit record: its selection and training steps."""
    return f"{record['selection']}, step {record['steps']}"


def combine_records(records: list[dict]) -> list[dict]:
    """Audit records as one list of one row per (record, lookahead): ROW_KEYS plus the record's checkpoint,
    device, commit, attention and command."""
    rows = []
    for record in records:
        extra = {k: record.get(k) for k in ("checkpoint", "device", "commit", "attention", "command")}
        rows += [{**{k: v for k, v in {**record, **r}.items() if k in ROW_KEYS}, **extra} for r in record["results"]]
    return rows
