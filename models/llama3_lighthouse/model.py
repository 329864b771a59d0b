"""torchtitan's Llama-3 with the inner attention call of chosen layers swapped for Lighthouse.

Only the call between RoPE and the output projection changes, so parameter names and shapes are those
of stock Llama-3 and a checkpoint loads whatever the attention setting.
"""
from __future__ import annotations

from typing import Callable

import torch
from torchtitan.models.llama3.model.model import Attention, Transformer, apply_rotary_emb

from lighthouse import LighthouseAttention, LighthouseConfig

from .args import LighthouseLlamaArgs
from .dense import DenseAttention
from .output import OutputLayer

SelectionObserver = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


class LighthouseLlamaAttention(Attention):
    """Llama-3 attention that runs `lighthouse_attention` on q [B,N,H,D], k/v [B,N,G,D] after RoPE.

    With `lighthouse` None, or after `use_lighthouse = False`, it is torchtitan's causal SDPA (exactly torchtitan's
    module with `dense_backend = "cudnn"`, else `DenseAttention`, which runs that module's call except where it
    takes FlashAttention).
    The Lighthouse call is the parameter-free module `inner_lighthouse`, so a parallelize function can
    swap it (e.g. for a context-parallel version) as torchtitan does with `inner_attention`.
    `selection_observer`, when set, is called with (q, k, v) detached, for logging statistics; skipped under
    torch.compile.
    """

    def __init__(self, model_args: LighthouseLlamaArgs, lighthouse: LighthouseConfig | None) -> None:
        super().__init__(model_args)
        if model_args.attn_type != "sdpa":
            raise ValueError(f"attn_type={model_args.attn_type!r}: Lighthouse layers replace causal SDPA only")
        if model_args.dense_backend != "cudnn":
            self.inner_attention = DenseAttention(model_args.dense_backend)
        self.lighthouse = lighthouse
        self.inner_lighthouse = LighthouseAttention(lighthouse) if lighthouse is not None else None
        self.use_lighthouse = lighthouse is not None
        self.selection_observer: SelectionObserver | None = None

    def forward(self, x, freqs_cis, attention_masks, positions=None):
        if not self.use_lighthouse:
            return super().forward(x, freqs_cis, attention_masks, positions)
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis, positions=positions)
        if self.selection_observer is not None and not torch.compiler.is_compiling():
            self.selection_observer(xq.detach(), xk.detach(), xv.detach())
        output = self.inner_lighthouse(xq, xk, xv)
        return self.wo(output.reshape(bs, seqlen, -1))


class LighthouseLlama(Transformer):
    """Llama-3 decoder whose layers run Lighthouse except `dense_layers` (all dense without a config).

    Its output layer can own the loss (`OutputLayer`): `model(tokens)` gives logits, `model(tokens, labels=labels)`
    the per-token nats of the fused output loss, which never holds the [tokens, vocab] logits."""

    def __init__(self, model_args: LighthouseLlamaArgs) -> None:
        super().__init__(model_args)
        # torchtitan's blocks build their own Attention; replace it (cheap: construction is on meta device).
        for layer_id, block in self.layers.items():
            dense = int(layer_id) in model_args.dense_layers
            block.attention = LighthouseLlamaAttention(model_args, None if dense else model_args.lighthouse)
        if self.output is not None:  # the same weight, now in a layer that can own the loss
            output = OutputLayer(model_args.dim, model_args.vocab_size, model_args.loss_chunk_tokens, device="meta")
            output.weight = self.output.weight
            self.output = output

    def hidden_states(self, tokens: torch.Tensor, attention_masks=None, positions=None) -> torch.Tensor:
        """The normed last hidden states [B, T, D] (torchtitan's forward without the output layer)."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis, attention_masks=attention_masks, positions=positions)
        return self.norm(h) if self.norm is not None else h

    def forward(self, tokens: torch.Tensor, attention_masks=None, positions=None,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V]; with `labels` [B, T], per-token nats [B, T] (0 at ignored labels)."""
        h = self.hidden_states(tokens, attention_masks, positions)
        return h if self.output is None else self.output(h, labels)

    def last_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] of the last position only: what sampling and NIAH read, without [B, T, V] logits."""
        return self.output(self.hidden_states(tokens)[:, -1])

    def lighthouse_enabled(self) -> bool:
        """Whether any layer runs Lighthouse now."""
        return any(isinstance(module, LighthouseLlamaAttention) and module.lighthouse is not None
                   and module.use_lighthouse for module in self.modules())

    def set_lighthouse_enabled(self, enabled: bool) -> None:
        """Switch every Lighthouse layer between Lighthouse and dense SDPA; dense layers stay dense."""
        for module in self.modules():
            if isinstance(module, LighthouseLlamaAttention) and module.lighthouse is not None:
                module.use_lighthouse = enabled
