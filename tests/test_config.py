"""SPEC section 3: which (config, seq_len) pairs are valid, and the static gathered length S."""
import dataclasses
import re

import pytest
import torch

from lighthouse import LighthouseConfig, select
from lighthouse.config_rules import DEFAULTS

from .helpers import random_qkv


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(levels=0, pool=2, topk=4, tile_budget=2), "levels=0 must be >= 1"),
        (dict(levels=2, pool=3, topk=4, tile_budget=2), "pool=3 must be a power of two"),
        (dict(levels=2, pool=1, topk=4, tile_budget=2), "pool=1 must be a power of two >= 2"),
        (dict(levels=2, pool=2, topk=6, tile_budget=6), "tile_budget=6 must be a power of two"),
        (dict(levels=2, pool=2, topk=1, tile_budget=1), "tile_budget=1 must be a power of two >= 2"),
        (dict(levels=2, pool=2, topk=6, tile_budget=4), "topk=6 must be a positive multiple of tile_budget=4"),
        (dict(levels=2, pool=2, topk=0, tile_budget=4), "topk=0 must be a positive multiple"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2, scorer="learned"), "scorer='learned' is not one of"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2, dilation=0), "dilation=0 must be >= 1"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2, backend="xformers"), "backend='xformers' is not one of"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2, backend="reference"), "is now implementation='reference'"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2, implementation="cuda"), "implementation='cuda' is not one of"),
        (dict(levels=2**70, pool=2, topk=4, tile_budget=2), f"levels={2**70} is too many for any sequence"),
        (dict(levels=3, pool=2**40, topk=4, tile_budget=2), "levels=3 is too many for any sequence"),
    ],
)
def test_every_setting_rule_rejects_at_construction_naming_the_values(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LighthouseConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, seq_len, message",
    [
        (dict(levels=3, pool=4, topk=4, tile_budget=2), 100, "seq_len=100 is not divisible by pool**(levels-1)=16"),
        (dict(levels=2, pool=2, topk=6, tile_budget=2), 64, "32 coarsest entries do not split into topk/tile_budget=3"),
        (dict(levels=2, pool=2, topk=32, tile_budget=4), 32, "each tile has 2 coarsest entries"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2, scorer="dilated", dilation=3), 64,
         "seq_len=64 is not divisible by dilation=3"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2), 0, "seq_len=0 must be >= 1"),
        (dict(levels=3, pool=2, topk=4, tile_budget=2), 2**70, f"seq_len={2**70} is too long"),
        (dict(levels=2, pool=2, topk=4, tile_budget=2, scorer="dilated", dilation=64), 64,
         "dilation=64 leaves one token in each strided sub-sequence of seq_len=64"),
    ],
)
def test_every_length_rule_rejects_with_a_message_naming_the_values(kwargs, seq_len, message):
    config = LighthouseConfig(**kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        config.validate(seq_len)


def test_the_defaults_a_study_reads_without_torch_are_every_fields_default():
    """`config_rules.DEFAULTS`, which the study loader falls back on where a job config omits a `[lighthouse]` key,
    holds the default of each field of `LighthouseConfig`, and nothing else."""
    assert {f.name: f.default for f in dataclasses.fields(LighthouseConfig)} == DEFAULTS


def test_select_validates_before_touching_the_inputs():
    q, k, _ = random_qkv(1, 100, 2, 2, 4)
    with pytest.raises(ValueError, match="seq_len=100 is not divisible"):
        select(q, k, LighthouseConfig(levels=3, pool=4, topk=4, tile_budget=2, selection="paper"))


GEOMETRIES = [
    # (N, p, L, k, m)
    (64, 2, 2, 4, 2),
    (64, 2, 3, 4, 2),
    (128, 2, 4, 8, 4),
    (256, 4, 3, 8, 4),
    (512, 4, 3, 16, 8),
    (512, 8, 2, 16, 16),
    (1024, 2, 5, 16, 4),
    (256, 2, 1, 4, 2),
]


@pytest.mark.parametrize("n, p, levels, k, m", GEOMETRIES, ids=["N{}-p{}-L{}-k{}-m{}".format(*g) for g in GEOMETRIES])
def test_gathered_length_matches_the_formula_and_the_selection(n, p, levels, k, m):
    config = LighthouseConfig(levels=levels, pool=p, topk=k, tile_budget=m, selection="paper")
    expected = n if levels == 1 else n // p ** (levels - 1) + (levels - 1) * p * k
    assert config.gathered_len(n) == expected
    q, k_, _ = random_qkv(2, n, 2, 1, 4, dtype=torch.float32)
    sel = select(q, k_, config)
    for field in (sel.level, sel.index, sel.expanded):
        assert field.shape == (2, 1, expected)
    assert sel.level.dtype == sel.index.dtype == torch.int64
