"""The next token's logits after a growing sequence, from a dense Llama-3 of the recipe, with a KV cache.

Uncached, each new token runs the whole window again (`uncached`). `KVCacheDecoder` runs the prompt once, then
each appended token alone through the layers, attending to the keys and values cached for the tokens before it:
the same computation as the model's forward (torchtitan's Llama-3 block: RMSNorm, RoPE at the token's position,
causal SDPA, SwiGLU), one position at a time. Once the sequence outgrows the window (the model's RoPE table), every
step sees the last `window` tokens at positions 0..window-1, as the uncached model does, so the cache restarts on
them. Dense attention only: a Lighthouse layer selects over a whole window of fixed length.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.models.llama3.model.model import apply_rotary_emb

from eval.metrics.heldout import LogitsFn

NextLogits = Callable[[list[int]], torch.Tensor]  # ids so far -> the next token's logits [V]


def uncached(logits_fn: LogitsFn, window: int) -> NextLogits:
    """The next token's logits from the model's forward over the last `window` ids."""
    return lambda ids: logits_fn(torch.tensor([ids[-window:]]))[0, -1]


class KVCacheDecoder:
    """`next_logits(ids)`: the logits after `ids`, running only the ids appended since the last call (one at a
    time) when `ids` extends the cached ones and fits the window, else the last `window` ids afresh."""

    def __init__(self, model: nn.Module, window: int, device: torch.device, dtype: torch.dtype = torch.float32):
        if model.lighthouse_enabled():
            raise ValueError("the KV cache decodes dense attention; switch the model's Lighthouse layers off")
        self.model, self.window, self.device, self.dtype = model, window, device, dtype
        self.ids: list[int] = []
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []

    @torch.no_grad()
    def next_logits(self, ids: list[int]) -> torch.Tensor:
        extends = bool(self.ids) and len(ids) == len(self.ids) + 1 <= self.window and ids[:-1] == self.ids
        if not extends:
            self.ids, self.cache = [], []
            ids = ids[-self.window:]
        new = ids[len(self.ids):]
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            logits = self._forward(torch.tensor([new], device=self.device), start=len(self.ids))
        self.ids = list(ids)
        return logits[0, -1]

    def _forward(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [1, n, V] of `tokens` [1, n] at positions start.., appending their keys and values to the cache
        (n > 1 only from an empty cache: the causal mask is then SDPA's own)."""
        model, n = self.model, tokens.shape[1]
        positions = torch.arange(start, start + n, device=self.device)[None]
        h = model.tok_embeddings(tokens)
        for i, block in enumerate(model.layers.values()):
            attention = block.attention
            x = block.attention_norm(h)
            q, k, v = (project(x).view(1, n, -1, attention.head_dim)
                       for project in (attention.wq, attention.wk, attention.wv))
            q, k = apply_rotary_emb(q, k, freqs_cis=model.freqs_cis, positions=positions)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            if start:
                k, v = torch.cat([self.cache[i][0], k], dim=2), torch.cat([self.cache[i][1], v], dim=2)
                self.cache[i] = (k, v)
            else:
                self.cache.append((k, v))
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=start == 0,
                                                 enable_gqa=q.shape[2] != k.shape[1])
            h = h + attention.wo(out.transpose(1, 2).reshape(1, n, -1))
            h = h + block.feed_forward(block.ffn_norm(h))
        return model.output(model.norm(h))
