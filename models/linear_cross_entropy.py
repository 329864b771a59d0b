"""The output layer and its cross-entropy in one op, a chunk of tokens at a time: `linear_cross_entropy`.

Each chunk's logits (hidden @ weight.T, in the inputs' dtype: bf16 matmuls in training) are turned into per-token
nats with a float32 log-sum-exp and freed. No [tokens, vocab] tensor ever exists: the largest is one chunk of
logits, [chunk, vocab] (float32 on the CPU path; on CUDA one compiled kernel per pass reads them as they are).
Where gradients are wanted, the forward also computes those of the nats' sum while each chunk's logits exist, as
Liger-Kernel's fused linear cross-entropy does (three matmuls, not four); the backward scales them by the incoming
gradient when that is one value for every token (a sum or mean loss), and otherwise recomputes each chunk, so the
op takes any gradient of its per-token output.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

IGNORE_INDEX = -100  # torch's and torchtitan's label that scores nothing


def chunk_lse(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 log-sum-exp, float32 target logit) of each row of one chunk's logits [C, V]."""
    x = logits.float()
    return torch.logsumexp(x, dim=-1), x.gather(1, targets[:, None]).squeeze(1)


def chunk_grad(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """d nats / d logits of one chunk, softmax - one-hot(target), times each row's `scale`; in the logits' dtype."""
    x = logits.float()
    target = torch.arange(x.shape[1], device=x.device)[None, :] == targets[:, None]
    return ((torch.exp(x - lse[:, None]) - target.float()) * scale[:, None]).to(logits.dtype)


def fused(fn: Callable) -> Callable:
    """`fn` compiled (one elementwise kernel per pass over a chunk's logits, no float32 copy of them) for CUDA
    tensors, at the first CUDA call (torch.compile's set-up costs seconds of import); as it is elsewhere (the CPU
    path and the tests: no compiler needed)."""
    compiled = None

    def call(logits: torch.Tensor, *args: torch.Tensor):
        nonlocal compiled
        if logits.device.type != "cuda":
            return fn(logits, *args)
        compiled = compiled or torch.compile(fn, dynamic=False)
        return compiled(logits, *args)
    return call


_lse, _grad = fused(chunk_lse), fused(chunk_grad)


def _chunks(tokens: int, chunk: int) -> Iterator[slice]:
    return (slice(start, min(start + chunk, tokens)) for start in range(0, tokens, chunk))


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward: per-token nats, and where a gradient is wanted, the gradients of their plain sum (each chunk's
    softmax - one-hot, through both matmuls, while its logits exist). Backward: those, times the incoming
    gradient where it is one value for every token (a sum or mean loss: training); any other incoming gradient
    recomputes each chunk's logits."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                grad_enabled: bool) -> torch.Tensor:
        valid = labels != IGNORE_INDEX
        targets, ones = torch.where(valid, labels, 0), valid.float()
        # needs_input_grad holds under no_grad too: evaluation must not pay for gradients
        want_hidden, want_weight = (grad_enabled and wanted for wanted in ctx.needs_input_grad[:2])
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        target_logits = torch.empty_like(lse)
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        for rows in _chunks(hidden.shape[0], chunk):
            logits = hidden[rows] @ weight.T
            lse[rows], target_logits[rows] = _lse(logits, targets[rows])
            if want_hidden or want_weight:
                grad_logits = _grad(logits, targets[rows], lse[rows], ones[rows])
                _backward_chunk(grad_logits, hidden, weight, rows, grad_hidden, grad_weight)
        ctx.save_for_backward(hidden, weight, targets, valid, lse, grad_hidden, grad_weight)
        ctx.chunk = chunk
        return torch.where(valid, lse - target_logits, 0.0)

    @staticmethod
    def backward(ctx, grad_nats: torch.Tensor):
        hidden, weight, targets, valid, lse, grad_hidden, grad_weight = ctx.saved_tensors
        if bool((grad_nats == grad_nats[0]).all()):  # one value for every token: scale the sum's gradients
            scale = grad_nats[0].float()
            return (None if grad_hidden is None else (grad_hidden * scale).to(hidden.dtype),
                    None if grad_weight is None else (grad_weight * scale).to(weight.dtype), None, None, None)
        scale = torch.where(valid, grad_nats.float(), 0.0)
        grad_hidden = None if grad_hidden is None else torch.empty_like(hidden)
        grad_weight = None if grad_weight is None else torch.zeros_like(grad_weight)
        for rows in _chunks(hidden.shape[0], ctx.chunk):
            grad_logits = _grad(hidden[rows] @ weight.T, targets[rows], lse[rows], scale[rows])
            _backward_chunk(grad_logits, hidden, weight, rows, grad_hidden, grad_weight)
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None


def _backward_chunk(grad_logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, rows: slice,
                    grad_hidden: torch.Tensor | None, grad_weight: torch.Tensor | None) -> None:
    """One chunk's share of both matmuls' gradients, written into `grad_hidden` and added to `grad_weight`."""
    if grad_hidden is not None:
        grad_hidden[rows] = grad_logits @ weight
    if grad_weight is not None:
        grad_weight += (grad_logits.T @ hidden[rows]).float()


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         chunk: int = 2048) -> torch.Tensor:
    """Per-token cross-entropy (nats, float32) of the logits `hidden @ weight.T` against `labels`, computed
    `chunk` tokens at a time; 0 where a label is IGNORE_INDEX.

    hidden [..., D], weight [V, D], labels [...] (the leading shape of hidden) -> nats [...]. Under autocast the
    matmuls run in the autocast dtype, as `F.linear` would; the log-sum-exp is always float32.
    """
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden {list(hidden.shape)} and labels {list(labels.shape)} differ in their token shape")
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    with torch.autocast(device, enabled=False):
        nats = _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1), chunk,
                                         torch.is_grad_enabled())
    return nats.view(labels.shape)
