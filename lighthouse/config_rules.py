"""The rules that make a Lighthouse layer's settings, and a (settings, seq_len) pair, valid (SPEC section 3), with the
settings' defaults and the names each string setting takes: the one definition of each, which `LighthouseConfig`
applies (`check` at construction, `validate(seq_len)`). Plain Python on the standard library alone, so a command line
can check a study's settings before its heavy imports (`recipe.experiments.payoff_grid` executes this file on its
own: importing it as `lighthouse.config_rules` would run the package's `__init__`, which imports torch)."""
from __future__ import annotations

import numbers

SELECTIONS = ("paper", "causal", "strict")
SCORERS = ("norm", "dilated")
BACKENDS = ("auto", "cudnn", "flash", "efficient", "math", "flash_attn")
IMPLEMENTATIONS = ("auto", "fused", "reference")

POSITION_BITS = 63  # int64 positions: packed keys (`lighthouse_kernels.ordering`) and indices count at most 2**63 - 1

DEFAULTS = {"levels": 3, "pool": 2, "topk": 1536, "tile_budget": 128, "scorer": "norm", "dilation": 4,
            "selection": "causal", "backend": "auto", "implementation": "auto"}
"""`LighthouseConfig`'s field defaults (its field docs say what each means): the paper's L3 p2 k1536 stage-1 layer
with causal selection. Here rather than in the dataclass so that a study's `[lighthouse]` keys fall back on them
without torch."""


def _is_power_of_two(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def check_settings(levels: int, pool: int, topk: int, tile_budget: int, scorer: str, dilation: int, selection: str,
                   backend: str, implementation: str) -> None:
    """Raise TypeError naming the setting and value if one has the wrong type, ValueError naming the values if one
    is invalid whatever the sequence length (`LighthouseConfig.check`)."""
    for name, value in (("levels", levels), ("pool", pool), ("topk", topk), ("tile_budget", tile_budget),
                        ("dilation", dilation)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{name}={value!r} must be an int, not {type(value).__name__}")
    for name, value in (("scorer", scorer), ("selection", selection), ("backend", backend),
                        ("implementation", implementation)):
        if not isinstance(value, str):
            raise TypeError(f"{name}={value!r} must be a str, not {type(value).__name__}")
    if levels < 1:
        raise ValueError(f"levels={levels} must be >= 1")
    if pool < 2 or not _is_power_of_two(pool):
        raise ValueError(f"pool={pool} must be a power of two >= 2")
    if (levels - 1) * (pool.bit_length() - 1) >= POSITION_BITS:  # p**(L-1) >= 2**63, uncomputed
        raise ValueError(f"levels={levels} is too many for any sequence: pool**(levels-1) (pool={pool}) "
                         f"must divide seq_len, whose positions count up to 2**{POSITION_BITS} in int64")
    if tile_budget < 2 or not _is_power_of_two(tile_budget):
        raise ValueError(f"tile_budget={tile_budget} must be a power of two >= 2")
    if topk < tile_budget or topk % tile_budget != 0:
        raise ValueError(f"topk={topk} must be a positive multiple of tile_budget={tile_budget}")
    if scorer not in SCORERS:
        raise ValueError(f"scorer={scorer!r} is not one of {SCORERS}")
    if selection not in SELECTIONS:
        raise ValueError(f"selection={selection!r} is not one of {SELECTIONS}")
    if dilation < 1:
        raise ValueError(f"dilation={dilation} must be >= 1")
    if backend == "reference":
        raise ValueError(
            "backend='reference' is now implementation='reference' (backend names the inner attention kernel)"
        )
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}")


def check_seq_len(seq_len: int, levels: int, pool: int, topk: int, tile_budget: int, scorer: str,
                  dilation: int) -> None:
    """Raise ValueError naming the values if a layer of these settings (checked by `check_settings`) cannot run on
    `seq_len` tokens (a Python int, or torch's symbolic int under compile; `LighthouseConfig.validate`)."""
    if isinstance(seq_len, bool) or not hasattr(type(seq_len), "bit_length"):
        raise ValueError(f"seq_len={seq_len!r} must be an int, not {type(seq_len).__name__}")
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be >= 1")
    # bits of the product, at most
    if seq_len.bit_length() + ((levels + 1) * levels).bit_length() > POSITION_BITS:
        raise ValueError(f"seq_len={seq_len} is too long: the packed keys of its pyramid entries (seq_len * "
                         f"(levels+1) * levels, levels={levels}) must fit in int64")
    if scorer == "dilated" and seq_len % dilation != 0:
        raise ValueError(f"seq_len={seq_len} is not divisible by dilation={dilation}")
    if scorer == "dilated" and seq_len // dilation < 2:
        raise ValueError(f"dilation={dilation} leaves one token in each strided sub-sequence of seq_len="
                         f"{seq_len}, so the dilated scorer scores each token against itself alone; it must be "
                         "at most seq_len / 2")
    if levels == 1:
        return
    if (levels - 1) * (pool.bit_length() - 1) >= seq_len.bit_length():  # p**(L-1) > seq_len
        raise ValueError(f"levels={levels} is too many for seq_len={seq_len}: pool**(levels-1) (pool="
                         f"{pool}) must divide seq_len")
    span = pool ** (levels - 1)
    if seq_len % span != 0:
        raise ValueError(f"seq_len={seq_len} is not divisible by pool**(levels-1)={span} (pool={pool}, "
                         f"levels={levels})")
    coarse = seq_len // span
    tiles = topk // tile_budget
    if coarse % tiles != 0:
        raise ValueError(
            f"seq_len/pool**(levels-1)={coarse} coarsest entries do not split into "
            f"topk/tile_budget={tiles} equal tiles (topk={topk}, tile_budget={tile_budget})"
        )
    if coarse // tiles < tile_budget:
        raise ValueError(
            f"each tile has {coarse // tiles} coarsest entries (seq_len={seq_len}, "
            f"pool**(levels-1)={span}, tiles={tiles}) but needs at least tile_budget={tile_budget}"
        )
