"""Lighthouse hyper-parameters and the rules that make a (config, seq_len) pair valid (SPEC section 3)."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .flash_attn import require_flash_attn, resolve_flash_attn
from .modes import SELECTIONS

SCORERS = ("norm", "dilated")
BACKENDS = ("auto", "cudnn", "flash", "efficient", "math", "flash_attn")
IMPLEMENTATIONS = ("auto", "fused", "reference")


POSITION_BITS = 63  # int64 positions: packed keys (`lighthouse_kernels.ordering`) and indices count at most 2**63 - 1


def _is_power_of_two(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


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
    """One Lighthouse layer's settings: the only definition of its fields and their defaults (the recipe's
    `[lighthouse]` section is derived from these fields, docs included).

    The settings are checked at construction; `validate(seq_len)` checks a sequence length against them.
    The defaults are the paper's L3 p2 k1536 stage-1 layer with causal selection.
    """

    levels: int = 3
    """Pyramid depth L (1 = plain dense causal attention)."""

    pool: int = 2
    """Pooling factor p between levels (a power of two >= 2)."""

    topk: int = 1536
    """Selection budget k per level (a multiple of tile_budget)."""

    tile_budget: int = 128
    """Per-tile budget m; each row is cut into topk / tile_budget tiles that select independently."""

    scorer: str = "norm"
    """"norm" (L2 norms of q and k) or "dilated" (strided softmax attention)."""

    dilation: int = 4
    """Stride of the dilated scorer."""

    selection: str = "causal"
    """"causal" (an entry scores the p**l tokens ending at its first token, so no score that decides what
    position j receives reads a token after j), "strict" (causal scores, and a tile expands its candidates
    online in position order, so no output row depends on a later token at all; SPEC section 3a) or "paper"
    (the max over the entry's whole window: a trained model learns to read the next tokens through it, so its
    stage-1 losses are optimistic; SPEC section 3). The default is "causal": docs/causality.md measures the
    leak, docs/results.md the time to quality."""

    backend: str = "auto"
    """Inner attention kernel on the gathered sub-sequence: auto (cuDNN on CUDA, or FlashAttention-4 where
    installed and measured faster for the card at the gathered length, `lighthouse.flash_attn.AUTO_FROM`; the
    flash kernel on CPU), cudnn, flash, efficient, math, flash_attn (FlashAttention-4, the flash extra)."""

    implementation: str = "auto"
    """Pipeline that runs the layer: auto (the fused Triton kernels on CUDA where they apply, else the
    pure-PyTorch reference), fused, or reference (debugging)."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise TypeError naming the field and value if a setting has the wrong type, ValueError naming the values
        if it is invalid whatever the sequence length; then load the kernels `backend` may run (`resolve_kernels`)."""
        for name in ("levels", "pool", "topk", "tile_budget", "dilation"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise TypeError(f"{name}={value!r} must be an int, not {type(value).__name__}")
        for name in ("scorer", "selection", "backend", "implementation"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name}={value!r} must be a str, not {type(value).__name__}")
        if self.levels < 1:
            raise ValueError(f"levels={self.levels} must be >= 1")
        if self.pool < 2 or not _is_power_of_two(self.pool):
            raise ValueError(f"pool={self.pool} must be a power of two >= 2")
        if (self.levels - 1) * (self.pool.bit_length() - 1) >= POSITION_BITS:  # p**(L-1) >= 2**63, uncomputed
            raise ValueError(f"levels={self.levels} is too many for any sequence: pool**(levels-1) (pool={self.pool}) "
                             f"must divide seq_len, whose positions count up to 2**{POSITION_BITS} in int64")
        if self.tile_budget < 2 or not _is_power_of_two(self.tile_budget):
            raise ValueError(f"tile_budget={self.tile_budget} must be a power of two >= 2")
        if self.topk < self.tile_budget or self.topk % self.tile_budget != 0:
            raise ValueError(
                f"topk={self.topk} must be a positive multiple of tile_budget={self.tile_budget}"
            )
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer={self.scorer!r} is not one of {SCORERS}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection={self.selection!r} is not one of {SELECTIONS}")
        if self.dilation < 1:
            raise ValueError(f"dilation={self.dilation} must be >= 1")
        if self.backend == "reference":
            raise ValueError(
                "backend='reference' is now implementation='reference' (backend names the inner attention kernel)"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not one of {BACKENDS}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation={self.implementation!r} is not one of {IMPLEMENTATIONS}")
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
        torch's symbolic int under compile)."""
        if isinstance(seq_len, bool) or not hasattr(type(seq_len), "bit_length"):
            raise ValueError(f"seq_len={seq_len!r} must be an int, not {type(seq_len).__name__}")
        if seq_len < 1:
            raise ValueError(f"seq_len={seq_len} must be >= 1")
        # bits of the product, at most
        if seq_len.bit_length() + ((self.levels + 1) * self.levels).bit_length() > POSITION_BITS:
            raise ValueError(f"seq_len={seq_len} is too long: the packed keys of its pyramid entries (seq_len * "
                             f"(levels+1) * levels, levels={self.levels}) must fit in int64")
        if self.scorer == "dilated" and seq_len % self.dilation != 0:
            raise ValueError(f"seq_len={seq_len} is not divisible by dilation={self.dilation}")
        if self.scorer == "dilated" and seq_len // self.dilation < 2:
            raise ValueError(f"dilation={self.dilation} leaves one token in each strided sub-sequence of seq_len="
                             f"{seq_len}, so the dilated scorer scores each token against itself alone; it must be "
                             "at most seq_len / 2")
        if self.levels == 1:
            return
        if (self.levels - 1) * (self.pool.bit_length() - 1) >= seq_len.bit_length():  # p**(L-1) > seq_len
            raise ValueError(f"levels={self.levels} is too many for seq_len={seq_len}: pool**(levels-1) (pool="
                             f"{self.pool}) must divide seq_len")
        span = self.coarsest_span
        if seq_len % span != 0:
            raise ValueError(
                f"seq_len={seq_len} is not divisible by pool**(levels-1)={span} "
                f"(pool={self.pool}, levels={self.levels})"
            )
        coarse = seq_len // span
        tiles = self.num_tiles
        if coarse % tiles != 0:
            raise ValueError(
                f"seq_len/pool**(levels-1)={coarse} coarsest entries do not split into "
                f"topk/tile_budget={tiles} equal tiles (topk={self.topk}, tile_budget={self.tile_budget})"
            )
        if coarse // tiles < self.tile_budget:
            raise ValueError(
                f"each tile has {coarse // tiles} coarsest entries (seq_len={seq_len}, "
                f"pool**(levels-1)={span}, tiles={tiles}) but needs at least tile_budget={self.tile_budget}"
            )

    def gathered_len(self, seq_len: int) -> int:
        """S = N / p**(L-1) + (L-1) * p * k, the static length of the gathered sub-sequence."""
        self.validate(seq_len)
        return gathered_length(seq_len, self.levels, self.pool, self.topk)
