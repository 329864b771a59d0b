"""backend="flash_attn": the first flash-attn implementation that imports runs, else a clear error."""
import sys
import types

import pytest
import torch

from lighthouse import LighthouseConfig, lighthouse_attention
from lighthouse.flash_attn import IMPLEMENTATIONS, flash_attn_causal, load_flash_attn

from .helpers import random_qkv

MODULES = [module for module, _ in IMPLEMENTATIONS]


@pytest.fixture
def no_flash_attn(monkeypatch):
    """Hide every flash-attn implementation (None in sys.modules makes import raise ImportError)."""
    for module in MODULES:
        monkeypatch.setitem(sys.modules, module, None)


def _fake_flash_attn(calls):
    def flash_attn_func(q, k, v, causal):
        calls.append(causal)
        return q * 2, None  # a (out, lse) pair, as some versions return

    return types.SimpleNamespace(flash_attn_func=flash_attn_func)


def test_missing_package_raises_naming_it(no_flash_attn):
    with pytest.raises(RuntimeError, match=r"backend='flash_attn' needs the flash-attn package \(the flash extra: "
                                           r"pip install -e '\.\[flash\]'"):
        load_flash_attn()


def test_the_layer_on_cpu_inputs_names_the_device_before_the_package(no_flash_attn):
    q, k, v = random_qkv(1, 64, 2, 2, 8)
    config = LighthouseConfig(levels=2, pool=2, topk=8, tile_budget=4, backend="flash_attn", selection="paper")
    with pytest.raises(ValueError, match=r"backend='flash_attn' needs CUDA inputs \(they are on cpu\)"):
        lighthouse_attention(q, k, v, config)


def test_prefers_flash_attention_3_and_calls_it_causal(no_flash_attn, monkeypatch):
    fa3, fa2 = [], []
    monkeypatch.setitem(sys.modules, "flash_attn_interface", _fake_flash_attn(fa3))
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn(fa2))
    assert load_flash_attn()[0] == "FlashAttention-3"
    q = torch.randn(1, 8, 2, 4)
    assert torch.equal(flash_attn_causal(q, q, q), q * 2)
    assert fa3 == [True] and fa2 == []


def test_falls_back_to_flash_attention_2(no_flash_attn, monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn([]))
    assert load_flash_attn()[0] == "FlashAttention-2"
