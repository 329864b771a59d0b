"""Inputs of the Triton kernels' tests that come from the kernels themselves (importing this needs Triton)."""
from __future__ import annotations

import functools

import torch

from lighthouse import LighthouseConfig, pyramid_index, pyramid_scores
from lighthouse.fused import select_gather_order, selection_of

from .helpers import DEVICE


@functools.cache
def random_selection(
    batch: int, kv_heads: int, seq_len: int, config: LighthouseConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed, slots, flat_index) of a selection drawn from fresh random scores on DEVICE: the kernels' gather
    order, its inverse map, and the reference's index into the concatenated pyramid. Drawn once per arguments
    and shared: the selection kernel costs most of a kernel test in Triton's interpreter, and the tests only
    read what it returns."""
    sq, sk = (torch.cat(pyramid_scores(torch.rand(batch, kv_heads, seq_len, device=DEVICE), config.pool,
                                       config.levels), dim=-1) for _ in range(2))
    order = select_gather_order(sq, sk, seq_len, config)
    flat = pyramid_index(selection_of(order.packed, config), seq_len, config.pool, config.levels)
    return order.packed, order.slots, flat
