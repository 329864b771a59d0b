"""Held-out loss: mean next-token cross-entropy over fixed windows of documents the run never trained on.

Windows are cut exactly as in training (`recipe.data.loader.PackedDocuments`: BOS + tokens + EOS per document,
concatenated, `seq_len + 1` tokens per window), from one pass over the files in sorted order, so the same
files give the same windows whatever the model or attention setting.

Per document (`document_loss`), each document's tokens are scored whole, as lm-eval's `loglikelihood_rolling`
scores them on the exported model: BOS before the first token, then disjoint windows of at most `seq_len`
predicted tokens, each window seeing the `seq_len` tokens before its last one (`rolling_windows`). The sum is
divided by the documents' UTF-8 bytes: nats (or bits) per byte compare models across tokenizers; with the byte
tokenizer they are nats per token.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from recipe.data.loader import BadDocument, PackedDocuments, match_local_files, read_documents
from recipe.progress import progress_bar
from torchtitan.components.tokenizer import BaseTokenizer

from recipe.data.tokenizer import ByteTokenizer, utf8_bytes


class _OnePass:
    """The documents of the files matching `pattern`, the value of the command line's `option`, in order, once
    (the training sources loop forever); ValueError naming the option and the first document that cannot be read."""

    def __init__(self, pattern: str, option: str) -> None:
        self.pattern, self.option = pattern, option
        self.files = match_local_files(pattern, option)

    def __iter__(self):
        for path in self.files:
            for document in read_documents(path):
                if isinstance(document, BadDocument):
                    raise ValueError(f"{self.option}={self.pattern!r}: {document.where}: {document.reason}")
                yield document


def heldout_windows(pattern: str, seq_len: int, count: int, option: str = "--data",
                    tokenizer: BaseTokenizer | None = None, count_option: str = "--windows") -> torch.Tensor:
    """The first `count` windows [count, seq_len + 1] of the files matching `pattern`, the value of the command
    line's `option` (named in a ValueError when it matches nothing usable or a document that cannot be read),
    tokenized by `tokenizer` (bytes); `count` is the value of `count_option`, named when the files hold fewer."""
    if count < 1 or seq_len < 1:
        raise ValueError(f"count={count} and seq_len={seq_len} must be >= 1")
    source = _OnePass(pattern, option)
    windows = []
    for window, labels in PackedDocuments(source, tokenizer or ByteTokenizer(), seq_len):
        windows.append(torch.cat([window["input"], labels[-1:]]))
        if len(windows) == count:
            return torch.stack(windows)
    raise ValueError(f"{option}={pattern!r} ({len(source.files)} files) holds {len(windows)} windows of "
                     f"{seq_len + 1} tokens, fewer than {count_option}={count}")


def heldout_documents(pattern: str, count: int, option: str = "--data", count_option: str = "--documents") -> list[str]:
    """The first `count` non-empty documents of the files matching `pattern`; ValueError naming `option` and
    `count_option` (whose value `count` is) when they hold fewer, or naming a document that cannot be read."""
    if count < 1:
        raise ValueError(f"count={count} must be >= 1")
    source = _OnePass(pattern, option)
    documents = []
    for document in source:
        if document:
            documents.append(document)
            if len(documents) == count:
                return documents
    raise ValueError(f"{option}={pattern!r} ({len(source.files)} files) holds {len(documents)} non-empty documents, "
                     f"fewer than {count_option}={count}")


def rolling_windows(tokens: list[int], prefix: int, seq_len: int) -> list[tuple[list[int], int]]:
    """lm-eval's rolling windows of a document's `tokens` (`get_rolling_token_windows` with context length 1, made
    disjoint): (ids, scored) pairs, ids the window's inputs and its last label, scored how many labels at its end
    are predicted in it; every token is predicted exactly once, the first after `prefix`."""
    if not tokens:
        return []
    first = min(seq_len, len(tokens))
    windows = [([prefix, *tokens[:first]], first)]
    predicted = first
    while predicted < len(tokens):
        scored = min(len(tokens) - predicted, seq_len)
        end = predicted + scored
        windows.append((tokens[end - seq_len - 1:end], scored))
        predicted = end
    return windows


# ids [B, T] -> logits [B, T, V]; a checkpoint's (`eval.checkpoint.CheckpointScorer`) also scores tokens through
# its output layer (`token_nats`, `last_logits`), so a large vocabulary at long context never makes [B, T, V] logits.
LogitsFn = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def token_losses(logits_fn: LogitsFn, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every label given its inputs: float32 [B, T] on the CPU (inputs on the model's device)."""
    if hasattr(logits_fn, "token_nats"):
        return logits_fn.token_nats(inputs, labels).float().cpu()
    logits = logits_fn(inputs).float()
    return F.cross_entropy(logits.transpose(1, 2), labels.to(logits.device), reduction="none").cpu()


def position_losses(logits_fn: LogitsFn, windows: torch.Tensor, batch_size: int = 1,
                    device: torch.device | str = "cpu", progress: bool | None = False,
                    desc: str = "held-out loss") -> torch.Tensor:
    """Mean cross-entropy at each position of the windows [W, T + 1] (inputs the first T, labels the last T),
    over all windows: float64 [T]. A progress bar `desc` over the batches when `progress` says so."""
    total = torch.zeros(windows.shape[1] - 1, dtype=torch.float64)
    bar = progress_bar(math.ceil(len(windows) / batch_size), desc, progress)
    for start in range(0, len(windows), batch_size):
        batch = windows[start:start + batch_size].to(device)
        total += token_losses(logits_fn, batch[:, :-1], batch[:, 1:]).sum(dim=0).double()
        bar.update()
    bar.close()
    return total / len(windows)


def mean_loss(logits_fn: LogitsFn, windows: torch.Tensor, batch_size: int = 1,
              device: torch.device | str = "cpu") -> float:
    """Mean cross-entropy (nats per token) of `logits_fn` over all windows."""
    return position_losses(logits_fn, windows, batch_size, device).mean().item()


def document_loss(logits_fn: LogitsFn, documents: list[str], seq_len: int, device: torch.device | str = "cpu",
                  progress: bool | None = False, tokenizer: BaseTokenizer | None = None) -> tuple[float, int]:
    """(cross-entropy in nats per UTF-8 byte, bytes scored) of the documents scored whole (`rolling_windows`),
    lm-eval's rolling log-likelihood of them over their bytes, tokenized by `tokenizer` (bytes by default); a
    progress bar over the documents when `progress` says so."""
    tokenizer = tokenizer or ByteTokenizer()
    total, count = 0.0, 0
    bar = progress_bar(len(documents), "held-out loss (documents)", progress)
    for document in documents:
        tokens = tokenizer.encode(document, add_bos=False, add_eos=False)
        for ids, scored in rolling_windows(tokens, tokenizer.bos_id, seq_len):
            window = torch.tensor([ids], device=device)
            losses = token_losses(logits_fn, window[:, :-1], window[:, 1:])
            total += losses[0, -scored:].double().sum().item()
        count += utf8_bytes(document)
        bar.update()
    bar.close()
    return total / count, count


def position_edges(seq_len: int, first: int = 64, factor: int = 4) -> list[int]:
    """Bucket edges 0, first, first*factor, ... up to seq_len: positions in a window, log-spaced."""
    edges = [0]
    while edges[-1] < seq_len:
        edges.append(min(seq_len, first if edges[-1] == 0 else edges[-1] * factor))
    return edges


def bucket_means(per_position: torch.Tensor, edges: list[int]) -> list[float]:
    """Mean of `position_losses` over the positions in [edges[i], edges[i+1]): whether later positions, which
    have more context, predict better (a model that uses far context keeps improving with position)."""
    return [per_position[a:b].mean().item() for a, b in zip(edges, edges[1:])]


def setting_losses(model: torch.nn.Module, logits_fn: LogitsFn, windows: torch.Tensor, lighthouse: bool,
                   batch_size: int = 1, device: torch.device | str = "cpu", by_position: bool = False,
                   progress: bool | None = None) -> tuple[dict[str, float], dict[str, list] | None]:
    """Held-out loss of the model as it is set, and when it runs Lighthouse (`lighthouse`), then with dense
    attention in every layer on the same weights (how much the weights depend on the sparsity; the model is left
    dense): ({"lighthouse": ..., "dense": ...}, with `by_position` {"edges": [...], <setting>: bucket means}).
    A progress bar per setting when `progress` says so (recipe.progress)."""
    loss: dict[str, float] = {}
    buckets: dict[str, list] = {"edges": position_edges(windows.shape[1] - 1)}

    def score(name: str) -> None:
        per_position = position_losses(logits_fn, windows, batch_size, device, progress, f"held-out loss ({name})")
        loss[name] = per_position.mean().item()
        if by_position:
            buckets[name] = bucket_means(per_position, buckets["edges"])

    if lighthouse:
        score("lighthouse")
        model.set_lighthouse_enabled(False)
    score("dense")
    return loss, buckets if by_position else None
