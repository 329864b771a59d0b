"""The output layer plus cross-entropy at a large vocabulary, per implementation: memory, time, and the loss's and
gradients' error against the full loss in float32 (`scripts/bench_output_loss.py`).

Implementations: "full" (bf16 logits, then torchtitan's float32 cross-entropy: what the recipe did before the
fused loss), "chunked" (`models.linear_cross_entropy`, the recipe's), and where installed Liger-Kernel's fused
linear cross-entropy ("liger") and Apple's Cut Cross-Entropy ("cce"). Each takes bf16 hidden states [T, D] and a
bf16 weight [V, D] and returns the mean loss over the tokens; the reference is the same mean in float32, computed
with stock autograd ops a chunk of tokens at a time (exact: the loss is a sum over tokens).
"""
from __future__ import annotations

import importlib.util
import math
from typing import Callable

import torch
import torch.nn.functional as F

from models.linear_cross_entropy import linear_cross_entropy

LossImpl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # hidden, weight, labels -> mean loss


def full_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy((hidden @ weight.T).float(), labels)


def chunked_loss(chunk: int) -> LossImpl:
    return lambda hidden, weight, labels: linear_cross_entropy(hidden, weight, labels, chunk).sum() / labels.numel()


def liger_loss() -> LossImpl:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss = LigerFusedLinearCrossEntropyLoss()
    return lambda hidden, weight, labels: loss(weight, hidden, labels)


def cce_loss() -> LossImpl:
    from cut_cross_entropy import linear_cross_entropy as cce

    return lambda hidden, weight, labels: cce(hidden, weight, labels)


def implementations(chunk: int) -> dict[str, LossImpl]:
    """The implementations that import here, by name."""
    impls: dict[str, LossImpl] = {"full": full_loss, "chunked": chunked_loss(chunk)}
    if importlib.util.find_spec("liger_kernel") is not None:
        impls["liger"] = liger_loss()
    if importlib.util.find_spec("cut_cross_entropy") is not None:
        impls["cce"] = cce_loss()
    return impls


def reference(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int = 4096
              ) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(mean loss, d loss / d hidden, d loss / d weight) in float32, by autograd on float32 copies, per chunk."""
    w = weight.float().requires_grad_()
    grad_hidden, total = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device), 0.0
    for start in range(0, hidden.shape[0], chunk):
        h = hidden[start:start + chunk].float().requires_grad_()
        loss = F.cross_entropy(h @ w.T, labels[start:start + chunk], reduction="sum") / labels.numel()
        loss.backward()
        grad_hidden[start:start + chunk] = h.grad
        total += loss.item()
    return total, grad_hidden, w.grad


def error_ratio(fast: torch.Tensor, ref: torch.Tensor) -> float:
    """RMSE(fast - ref) / RMS(ref)."""
    fast, ref = fast.float(), ref.float()
    return ((fast - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def measure(impl: LossImpl, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
            ref: tuple[float, torch.Tensor, torch.Tensor], reps: int = 3) -> dict:
    """Forward + backward of `impl`: median ms over `reps` after one warm-up, peak memory above the inputs (GiB),
    and the loss's relative error and the gradients' error ratios against `ref`; or the out-of-memory line."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    try:
        for rep in range(reps + 1):
            h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = impl(h, w, labels)
            loss.backward()
            end.record()
            torch.cuda.synchronize()
            if rep:
                times.append(start.elapsed_time(end))
    except torch.OutOfMemoryError as err:
        return {"error": "out of memory", "line": " ".join(str(err).split())[:200]}
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    ref_loss, ref_h, ref_w = ref
    return {"ms": sorted(times)[len(times) // 2], "peak_gib": peak,
            "loss": loss.item(), "loss_rel_error": abs(loss.item() - ref_loss) / ref_loss,
            "grad_hidden_error_ratio": error_ratio(h.grad, ref_h),
            "grad_weight_error_ratio": error_ratio(w.grad, ref_w)}


def inputs(tokens: int, dim: int, vocab: int, device: torch.device, seed: int = 0):
    """bf16 hidden states (RMS-normed scale) and an output weight of init scale, and labels."""
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(tokens, dim, device=device, generator=gen).bfloat16()
    weight = (torch.randn(vocab, dim, device=device, generator=gen) / math.sqrt(dim)).bfloat16()
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=gen)
    return hidden, weight, labels
