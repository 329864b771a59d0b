"""Lighthouse hyper-parameters, checked at construction and against a seq_len by the rules of `config_rules`
(SPEC section 3)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config_rules import (  # noqa: F401  (SCORERS, SELECTIONS: also read as `lighthouse.config`'s)
    DEFAULTS, SCORERS, SELECTIONS, check_seq_len, check_settings)
from .flash_attn import require_flash_attn, resolve_flash_attn


def gathered_length(seq_len: int, levels: int, pool: int, topk: int) -> int:
    """S = N / p**(L-1) + (L-1) * p * k (N itself for L = 1), unchecked: plain arithmetic, so torch.compile's
    symbolic ints go through it too (`LighthouseConfig.gathered_len` checks the pair first)."""
    return seq_len // pool ** (levels - 1) + (levels - 1) * pool * topk


def resolve_kernels(backend: str) -> None:
    """Load what `backend` may run before any call traces it: FlashAttention-4 for "flash_attn" (ValueError
    if it does not import) and, on a machine with CUDA, for "auto" (which takes it only where it imports)."""
    if backend == "flash_attn":
        require_flash_attn()
    elif backend == "auto" and torch.cuda.is_available():
        resolve_flash_attn()


@dataclass(frozen=True)
class LighthouseConfig:
    """One Lighthouse layer's settings: the only definition of its fields (the recipe's `[lighthouse]` section is
    derived from these fields, docs included); their defaults are `config_rules.DEFAULTS`, readable without torch.

    The settings are checked at construction; `validate(seq_len)` checks a sequence length against them.
    The defaults are the paper's L3 p2 k1536 stage-1 layer with causal selection.
    """

    levels: int = DEFAULTS["levels"]
    """Pyramid depth L (1 = plain dense causal attention)."""

    pool: int = DEFAULTS["pool"]
    """Pooling factor p between levels (a power of two >= 2)."""

    topk: int = DEFAULTS["topk"]
    """Selection budget k per level (a multiple of tile_budget)."""

    tile_budget: int = DEFAULTS["tile_budget"]
    """Per-tile budget m; each row is cut into topk / tile_budget tiles that select independently."""

    scorer: str = DEFAULTS["scorer"]
    """"norm" (L2 norms of q and k) or "dilated" (strided softmax attention)."""

    dilation: int = DEFAULTS["dilation"]
    """Stride of the dilated scorer."""

    selection: str = DEFAULTS["selection"]
    """"causal" (an entry scores the p**l tokens ending at its first token, so no score that decides what
    position j receives reads a token after j), "strict" (causal scores, and a tile expands its candidates
    online in position order, so no output row depends on a later token at all; SPEC section 3a) or "paper"
    (the max over the entry's whole window: a trained model learns to read the next tokens through it, so its
    stage-1 losses are optimistic; SPEC section 3). The default is "causal": docs/causality.md measures the
    leak, docs/results.md the time to quality."""

    backend: str = DEFAULTS["backend"]
    """Inner attention kernel on the gathered sub-sequence: auto (cuDNN on CUDA, or FlashAttention-4 where
    installed and measured faster for the card at the gathered length, `lighthouse.flash_attn.AUTO_FROM`; the
    flash kernel on CPU), cudnn, flash, efficient, math, flash_attn (FlashAttention-4, the flash extra)."""

    implementation: str = DEFAULTS["implementation"]
    """Pipeline that runs the layer: auto (the fused Triton kernels on CUDA where they apply, else the
    pure-PyTorch reference), fused, or reference (debugging)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise TypeError naming the field and value if a setting has the wrong type, ValueError naming the values if
        it is invalid whatever the sequence length (`config_rules.check_settings`); then load the kernels `backend`
        may run (`resolve_kernels`)."""
        check_settings(levels=self.levels, pool=self.pool, topk=self.topk, tile_budget=self.tile_budget,
                       scorer=self.scorer, dilation=self.dilation, selection=self.selection, backend=self.backend,
                       implementation=self.implementation)
        resolve_kernels(self.backend)

    @property
    def num_tiles(self) -> int:
        """T = k / m tiles per (batch, kv-head) row."""
        return self.topk // self.tile_budget

    @property
    def trailing_scores(self) -> bool:
        """Whether an entry scores the p**l tokens ending at its first token ("causal", "strict"), which reach
        p**(L-1) - 1 tokens before a sequence shard, rather than its own window ("paper")."""
        return self.selection != "paper"

    @property
    def coarsest_span(self) -> int:
        """p**(L-1): base tokens covered by one coarsest entry."""
        return self.pool ** (self.levels - 1)

    def validate(self, seq_len: int) -> None:
        """Raise ValueError naming the values if this config cannot run on `seq_len` tokens (a Python int, or
        torch's symbolic int under compile; `config_rules.check_seq_len`)."""
        check_seq_len(seq_len, self.levels, self.pool, self.topk, self.tile_budget, self.scorer, self.dilation)

    def gathered_len(self, seq_len: int) -> int:
        """S = N / p**(L-1) + (L-1) * p * k, the static length of the gathered sub-sequence."""
        self.validate(seq_len)
        return gathered_length(seq_len, self.levels, self.pool, self.topk)
