"""The fused output loss (`models.linear_cross_entropy`) is the output layer plus torch's cross-entropy: the same
per-token nats and the same gradients of the hidden states and the weight (float32, relative error at most 1e-6),
for chunks that do not divide the tokens, ignored labels and a vocabulary that is no multiple of the chunk; and it
never holds more than one chunk of logits."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from models.linear_cross_entropy import IGNORE_INDEX, linear_cross_entropy
from models.llama3_lighthouse.output import OutputLayer


def relative_error(fast: torch.Tensor, ref: torch.Tensor) -> float:
    """||fast - ref|| / ||ref|| (the norm of the whole tensor)."""
    return ((fast - ref).norm() / ref.norm()).item()


def inputs(tokens: int, dim: int, vocab: int, ignored: int, seed: int):
    """Fresh hidden states, weight and labels (`ignored` of them IGNORE_INDEX), float32."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, dim, generator=gen)
    weight = torch.randn(vocab, dim, generator=gen) / dim ** 0.5
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    labels[torch.randperm(tokens, generator=gen)[:ignored]] = IGNORE_INDEX
    return hidden, weight, labels


CASES = [  # tokens, dim, vocab, chunk, ignored labels
    (64, 16, 50, 64, 0),     # one chunk
    (67, 16, 50, 8, 5),      # a chunk that does not divide the tokens, ignored labels
    (100, 24, 301, 7, 13),   # a vocabulary that is no multiple of the chunk
    (33, 8, 1000, 100, 2),   # a chunk longer than the tokens
]


@pytest.mark.parametrize("incoming", ["mean", "per_token"])  # the training loss's gradient, and any other
@pytest.mark.parametrize("tokens,dim,vocab,chunk,ignored", CASES,
                         ids=[f"T{t}-D{d}-V{v}-C{c}-I{i}" for t, d, v, c, i in CASES])
def test_nats_and_gradients_equal_the_full_loss(tokens, dim, vocab, chunk, ignored, incoming):
    hidden, weight, labels = inputs(tokens, dim, vocab, ignored, seed=tokens + vocab)
    if incoming == "mean":  # one value for every token: the gradients computed in the forward, scaled
        grad_out = torch.full((tokens,), 1 / (tokens - ignored))
    else:  # any per-token gradient: each chunk recomputed in the backward
        grad_out = torch.rand(tokens, generator=torch.Generator().manual_seed(1))

    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = F.cross_entropy(h_ref @ w_ref.T, labels, ignore_index=IGNORE_INDEX, reduction="none")
    (ref * grad_out).sum().backward()

    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    nats = linear_cross_entropy(h, w, labels, chunk)
    (nats * grad_out).sum().backward()

    assert nats.dtype == torch.float32 and nats.shape == labels.shape
    assert (nats[labels == IGNORE_INDEX] == 0).all()
    assert relative_error(nats, ref) <= 1e-6
    assert relative_error(nats.sum(), ref.sum()) <= 1e-6
    assert relative_error(h.grad, h_ref.grad) <= 1e-6
    assert relative_error(w.grad, w_ref.grad) <= 1e-6
    assert (h.grad[labels == IGNORE_INDEX] == 0).all()  # an ignored label sends no gradient to its token


def test_the_output_layer_gives_logits_without_labels_and_nats_with_them():
    """Batch-shaped inputs [B, T, D]; logits are nn.Linear's bit for bit, nats those of the same logits."""
    torch.manual_seed(0)
    layer = OutputLayer(12, 40, chunk_tokens=5)
    hidden, labels = torch.randn(2, 9, 12), torch.randint(0, 40, (2, 9))
    logits = layer(hidden)
    assert torch.equal(logits, F.linear(hidden, layer.weight))
    nats = layer(hidden, labels)
    assert nats.shape == (2, 9)
    ref = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    assert relative_error(nats, ref) <= 1e-6


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def largest_tensor(loss_fn, hidden, weight, labels) -> int:
    """The largest tensor (elements) any op makes in the forward and backward of `loss_fn`."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with LargestTensor() as mode:
        loss_fn(h, w, labels).sum().backward()
    return mode.numel


def test_no_tensor_larger_than_one_chunk_of_logits():
    """With the vocabulary far above the hidden size, chunk x vocab bounds every tensor of the fused loss, which
    the full loss exceeds by tokens / chunk: the bound is tight enough to see [tokens, vocab] logits."""
    tokens, dim, vocab, chunk = 96, 4, 500, 8
    hidden, weight, labels = inputs(tokens, dim, vocab, ignored=3, seed=2)
    fused = largest_tensor(lambda h, w, y: linear_cross_entropy(h, w, y, chunk), hidden, weight, labels)
    full = largest_tensor(lambda h, w, y: F.cross_entropy(h @ w.T, y, reduction="none"), hidden, weight, labels)
    assert fused <= chunk * vocab
    assert full >= tokens * vocab


class MatmulCount(TorchDispatchMode):
    """Counts matrix multiplications."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket is torch.ops.aten.mm
        return func(*args, **(kwargs or {}))


def test_three_matmuls_a_chunk_in_training_and_one_in_evaluation():
    """With gradients the forward runs each chunk's logits and both gradient matmuls, and the backward of a mean
    loss runs none; under no_grad (evaluation, with parameters that require grad) only the logits."""
    hidden, weight, labels = inputs(40, 4, 30, ignored=2, seed=4)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with MatmulCount() as forward:
        loss = linear_cross_entropy(h, w, labels, chunk=10).mean()
    with MatmulCount() as backward:
        loss.backward()
    with torch.no_grad(), MatmulCount() as evaluation:
        linear_cross_entropy(h, w, labels, chunk=10)
    assert (forward.count, backward.count, evaluation.count) == (12, 0, 4)


def test_a_bad_chunk_or_label_shape_is_named():
    hidden, weight, labels = inputs(8, 4, 10, 0, seed=3)
    with pytest.raises(ValueError, match="chunk=0"):
        linear_cross_entropy(hidden, weight, labels, 0)
    with pytest.raises(ValueError, match=r"labels \[7\]"):
        linear_cross_entropy(hidden, weight, labels[:7], 4)
