"""The output layer and its cross-entropy in one op, a chunk of tokens at a time: `linear_cross_entropy`.

Each chunk's logits (hidden @ weight.T, in the inputs' dtype: bf16 matmuls in training) are turned into per-token
nats with a float32 log-sum-exp and freed; the backward recomputes them chunk by chunk. No [tokens, vocab] tensor
ever exists: the largest is one chunk of float32 logits, [chunk, vocab]. This is Liger-Kernel's fused linear
cross-entropy in plain PyTorch, with one difference: the gradient is computed in the backward (a second matmul of
each chunk), so the op takes any gradient of its per-token output, not only the mean loss's.
"""
from __future__ import annotations

import torch

IGNORE_INDEX = -100  # torch's and torchtitan's label that scores nothing


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """float32 logits [end - start, vocab] of the tokens start..end."""
    return (hidden[start:end] @ weight.T).float()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
        valid = labels != IGNORE_INDEX
        targets = torch.where(valid, labels, 0)
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        target_logits = torch.empty_like(lse)
        for start in range(0, hidden.shape[0], chunk):
            end = min(start + chunk, hidden.shape[0])
            logits = _chunk_logits(hidden, weight, start, end)
            lse[start:end] = torch.logsumexp(logits, dim=-1)
            target_logits[start:end] = logits.gather(1, targets[start:end, None]).squeeze(1)
            del logits
        ctx.save_for_backward(hidden, weight, targets, valid, lse)
        ctx.chunk = chunk
        return torch.where(valid, lse - target_logits, 0.0)

    @staticmethod
    def backward(ctx, grad_nats: torch.Tensor):
        hidden, weight, targets, valid, lse = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[:2]
        scale = torch.where(valid, grad_nats.float(), 0.0)
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = min(start + ctx.chunk, hidden.shape[0])
            # d nats / d logits = softmax - one-hot(target), times each token's incoming gradient
            grad_logits = _chunk_logits(hidden, weight, start, end).sub_(lse[start:end, None]).exp_()
            grad_logits[torch.arange(end - start, device=hidden.device), targets[start:end]] -= 1.0
            grad_logits = grad_logits.mul_(scale[start:end, None]).to(hidden.dtype)
            if want_hidden:
                grad_hidden[start:end] = grad_logits @ weight
            if want_weight:
                grad_weight += (grad_logits.T @ hidden[start:end]).float()
            del grad_logits
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None


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
        nats = _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1), chunk)
    return nats.view(labels.shape)
