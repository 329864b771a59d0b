"""backend="flash_attn": FlashAttention-4 is resolved when a config is checked, a clear error when it does not
import; its two custom ops, here backed by a CPU stand-in registered the same way, match the pure-PyTorch
reference in values and gradients (eager, and compiled with fullgraph=True through the fused layer), pass
torch's operator checks, and run the model's dense layers; `auto` takes FlashAttention only where measured.
(Under context parallelism: tests/test_context_parallel.py.)"""
import dataclasses
import json
import sys
import types

import pytest
import torch

from lighthouse import LighthouseConfig, lighthouse_attention
from lighthouse import flash_attn
from lighthouse.attention import causal_attention, resolve_backend
from lighthouse.testing import assert_close

from .helpers import REPO, cpu_flash_attn, random_qkv

F32 = torch.float32
GEOMETRY = dict(levels=3, pool=2, topk=16, tile_budget=4)  # N=128: 4 tiles of 8 coarsest entries


@pytest.fixture
def stand_in():
    with cpu_flash_attn():
        yield


@pytest.fixture
def nothing_registered(monkeypatch):
    """No implementation registered and none loaded yet (the first load in a fresh process)."""
    monkeypatch.setattr(flash_attn, "_registered", None)
    flash_attn._load_flash_attention_4.cache_clear()
    yield
    flash_attn._load_flash_attention_4.cache_clear()


def _output_and_grads(layer, q, k, v, grad_o):
    out = layer(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_o))


def _reference(q, k, v, config, grad_o):
    ref = dataclasses.replace(config, backend="math", implementation="reference")
    return _output_and_grads(lambda *x: lighthouse_attention(*x, ref), q, k, v, grad_o)


def _assert_close_all(ref, fast):
    for name, a, b in zip(("o", "dq", "dk", "dv"), ref, fast):
        assert_close(name, a, b, F32)


def test_missing_flash_attention_4_is_named_when_the_config_is_checked(nothing_registered, monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)  # None makes import raise ImportError
    with pytest.raises(ValueError, match=r"backend='flash_attn' needs FlashAttention-4 \(the flash extra: "
                                         r"pip install -e '\.\[flash\]'\), which did not import \(flash_attn\.cute"):
        LighthouseConfig(**GEOMETRY, backend="flash_attn")
    assert LighthouseConfig(**GEOMETRY).backend == "auto"  # auto does without it


def test_flash_attention_4_is_imported_once_and_called_with_its_log_sum_exp(nothing_registered, monkeypatch):
    calls = []

    def fwd(q, k, v, causal, return_lse):
        calls.append(("fwd", causal, return_lse))
        return q * 2, q.new_zeros(q.shape[0], q.shape[2], q.shape[1]), None, None, None

    def bwd(q, k, v, out, dout, lse, causal):
        calls.append(("bwd", causal, torch.equal(out, q * 2), torch.equal(dout, -q)))
        return q + 1, k + 1, v + 1

    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface",
                        types.SimpleNamespace(_flash_attn_fwd=fwd, _flash_attn_bwd=bwd))
    LighthouseConfig(**GEOMETRY, backend="flash_attn")
    kernels = flash_attn.flash_attn_kernels()
    assert (kernels.name, kernels.devices) == ("FlashAttention-4", ("cuda",))
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", None)  # a second import would fail now
    assert LighthouseConfig(**GEOMETRY, backend="flash_attn") and flash_attn.flash_attn_kernels() is kernels
    q = torch.randn(1, 8, 2, 4)
    out, lse = kernels.forward(q, q, q, True)
    assert torch.equal(out, q * 2) and lse.shape == (1, 2, 8)
    assert kernels.backward(-q, q, q, q, out, lse, True)[0].equal(q + 1)
    assert calls == [("fwd", True, True), ("bwd", True, True, True)]


def test_on_cpu_inputs_the_fa4_backend_names_the_device(nothing_registered):
    flash_attn.register_flash_attn(flash_attn.FlashAttnKernels("FA4", None, None, ("cuda",)))
    with pytest.raises(ValueError, match=r"backend='flash_attn' needs CUDA inputs \(they are on cpu\)"):
        causal_attention(*random_qkv(1, 8, 2, 2, 8), "flash_attn")


@pytest.mark.parametrize("selection", ["paper", "causal", "strict"])
@pytest.mark.parametrize("scorer", ["norm", "dilated"])
def test_reference_layer_on_flash_attn_matches_the_reference(stand_in, scorer, selection):
    config = LighthouseConfig(**GEOMETRY, scorer=scorer, selection=selection, backend="flash_attn",
                              implementation="reference")
    q, k, v = random_qkv(2, 128, 4, 2, 16, dtype=F32, requires_grad=True)
    grad_o = torch.randn_like(q)
    _assert_close_all(_reference(q, k, v, config, grad_o),
                      _output_and_grads(lambda *x: lighthouse_attention(*x, config), q, k, v, grad_o))


def test_compiled_fused_layer_traces_through_flash_attn_and_matches_the_reference(stand_in):
    # fullgraph=True: one graph or Dynamo raises naming the break; the fused layer is one custom op whose fake
    # and backward call FlashAttention's ops (scorer and selection run inside it: the grid above covers them)
    pytest.importorskip("triton")
    config = LighthouseConfig(**GEOMETRY, selection="causal", backend="flash_attn", implementation="fused")
    q, k, v = random_qkv(1, 128, 4, 2, 16, dtype=F32, requires_grad=True)
    grad_o = torch.randn_like(q)
    eager = _output_and_grads(lambda *x: lighthouse_attention(*x, config), q, k, v, grad_o)
    assert type(eager[0].grad_fn).__name__ == "FusedLighthouseBackward"
    compiled = torch.compile(lambda *x: lighthouse_attention(*x, config), backend="aot_eager", fullgraph=True)
    _assert_close_all(_reference(q, k, v, config, grad_o), eager)
    for name, a, b in zip(("o", "dq", "dk", "dv"), eager, _output_and_grads(compiled, q, k, v, grad_o)):
        assert torch.equal(a, b), name


def test_compiled_dense_attention_is_the_op_with_its_backward(stand_in):
    q, k, v = random_qkv(2, 64, 4, 1, 16, dtype=F32, requires_grad=True)
    grad_o = torch.randn_like(q)
    dense = torch.compile(lambda *x: causal_attention(*x, "flash_attn"), backend="aot_eager", fullgraph=True)
    _assert_close_all(_output_and_grads(lambda *x: causal_attention(*x, "math"), q, k, v, grad_o),
                      _output_and_grads(dense, q, k, v, grad_o))


def test_ops_pass_opcheck(stand_in):
    q, k, v = (x.transpose(1, 2) for x in random_qkv(1, 16, 4, 2, 8, dtype=F32, requires_grad=True))
    torch.library.opcheck(torch.ops.lighthouse.flash_attn_forward.default, (q, k, v, True))
    q, k, v = (x.detach() for x in (q, k, v))
    o, lse = torch.ops.lighthouse.flash_attn_forward(q, k, v, False)
    torch.library.opcheck(torch.ops.lighthouse.flash_attn_backward.default,
                          (torch.randn_like(o), q, k, v, o, lse, False))


CROSSOVER = 18_432  # a measured entry of AUTO_FROM, as the tests set it


@pytest.mark.parametrize("card, length, dtype, expected", [
    ((9, 0), CROSSOVER, torch.bfloat16, "flash_attn"),
    ((9, 0), CROSSOVER - 1, torch.bfloat16, "cudnn"),  # shorter: where it was measured slower
    ((9, 0), None, torch.bfloat16, "cudnn"),
    ((9, 0), 1 << 20, torch.float32, "efficient"),
    ((12, 0), 1 << 20, torch.bfloat16, "cudnn"),  # a card without a measurement
], ids=["from-the-crossover", "below-it", "length-unknown", "float32", "unmeasured-card"])
def test_auto_takes_flash_attn_only_where_measured_faster(nothing_registered, monkeypatch, card, length, dtype,
                                                          expected):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        major=card[0], minor=card[1]))
    monkeypatch.setattr(flash_attn, "AUTO_FROM", {(9, 0): CROSSOVER})
    cuda = torch.device("cuda")
    assert resolve_backend("auto", cuda, dtype, length=length) in ("cudnn", "efficient")  # nothing registered
    flash_attn.register_flash_attn(flash_attn.FlashAttnKernels("FA4", None, None, ("cuda",)))
    assert resolve_backend("auto", cuda, dtype, length=length) == expected
    assert resolve_backend("auto", torch.device("cpu"), dtype, length=length) == "flash"


def test_the_shipped_h200_crossover_is_where_the_record_measured_flash_attention_faster_at_every_length():
    record = json.loads((REPO / "docs/records/flash_attn_check.json").read_text())
    assert record["capability"] == "sm90" and flash_attn.AUTO_FROM[(9, 0)] == record["auto_from"]
    for point in record["crossover"]:
        faster = point["flash_attn_fwd_bwd_ms"] < point["cudnn_fwd_bwd_ms"]
        assert faster == (point["S"] >= flash_attn.AUTO_FROM[(9, 0)]), point


def test_dense_backend_flash_attn_runs_the_dense_layers_like_torchtitans_sdpa(stand_in):
    import models  # noqa: F401  (before torchtitan's model modules)
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper

    from models.llama3_lighthouse import FLAVORS, LighthouseLlama
    from models.llama3_lighthouse.dense import DenseAttention

    config = LighthouseConfig(**GEOMETRY, selection="causal")
    args = dataclasses.replace(FLAVORS["debug"], lighthouse=config, dense_layers=(0,), max_seq_len=128,
                               dense_backend="cudnn")
    torch.manual_seed(0)
    stock = LighthouseLlama(args)
    assert {type(b.attention.inner_attention) for b in stock.layers.values()} == {ScaledDotProductAttentionWrapper}
    flash = LighthouseLlama(dataclasses.replace(args, dense_backend="flash_attn"))
    flash.load_state_dict(stock.state_dict())
    assert {type(b.attention.inner_attention) for b in flash.layers.values()} == {DenseAttention}
    tokens = torch.randint(0, args.vocab_size, (2, 128))
    for switched in (False, True):  # the dense layer only, then every layer after a switch to dense
        results = []
        for model in (stock, flash):
            model.set_lighthouse_enabled(not switched)
            model.zero_grad()
            loss = model(tokens).float().logsumexp(-1).mean()
            loss.backward()
            results.append([loss] + [p.grad for p in model.parameters()])
        for ref, fast in zip(*results):
            assert_close("loss and gradients", ref, fast, F32)
