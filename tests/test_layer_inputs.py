"""The layer API names a wrong-typed setting or input at the call: config fields of the wrong type, a length that
is not an int, tensors of an integer, complex or float8 dtype, empty dimensions, and what `select` is given."""
import re

import numpy as np
import pytest
import torch

from lighthouse import LighthouseAttention, LighthouseConfig, lighthouse_attention, select
from lighthouse.inputs import check_inputs
from tests.helpers import random_qkv

VALID = dict(levels=2, pool=2, topk=4, tile_budget=2)


@pytest.mark.parametrize("field, value, kind", [
    ("topk", 32.0, "float"), ("levels", True, "bool"), ("pool", "2", "str"), ("tile_budget", None, "NoneType"),
    ("dilation", 4.5, "float"), ("scorer", 1, "int"), ("backend", None, "NoneType"),
], ids=lambda x: str(x))
def test_a_config_field_of_the_wrong_type_is_a_type_error_naming_field_and_value(field, value, kind):
    with pytest.raises(TypeError, match=rf"^{field}={value!r} must be an? (int|str), not {kind}$"):
        LighthouseConfig(**{**VALID, field: value})


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.complex64, torch.bool, torch.float8_e4m3fn,
                                   torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("entry", ["lighthouse_attention", "select"])
def test_tensors_of_a_dtype_lighthouse_cannot_score_are_a_type_error_naming_the_dtype(dtype, entry):
    q, k, v = (x.to(dtype) for x in random_qkv(1, 64, 4, 2, 8))
    call = {"lighthouse_attention": lambda: lighthouse_attention(q, k, v, LighthouseConfig(**VALID)),
            "select": lambda: select(q, k, LighthouseConfig(**VALID), v=v)}[entry]
    with pytest.raises(TypeError, match=rf"^q has dtype {dtype}; Lighthouse takes float16, bfloat16, float32 or "
                                        "float64$"):
        call()


@pytest.mark.parametrize("shapes", [
    ((1, 64, 0, 8), (1, 64, 0, 8)), ((1, 64, 4, 8), (1, 64, 0, 8)), ((0, 64, 4, 8), (0, 64, 2, 8)),
    ((1, 64, 4, 0), (1, 64, 2, 0)),
], ids=["H0-G0", "G0", "B0", "D0"])
def test_an_empty_dimension_is_named_with_the_shapes(shapes):
    q, k = (torch.randn(*s) for s in shapes)
    message = (f"q, k, v must have no empty dimension (B, N, heads, D >= 1); got q{tuple(shapes[0])}, "
               f"k{tuple(shapes[1])}, v{tuple(shapes[1])}")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        lighthouse_attention(q, k, k.clone(), LighthouseConfig(**VALID))


def test_select_checks_its_config_and_inputs_before_scoring():
    q, k, _ = random_qkv(1, 64, 4, 2, 8)
    with pytest.raises(TypeError, match="^config must be a LighthouseConfig, not dict$"):
        select(q, k, dict(VALID))
    with pytest.raises(ValueError, match=r"must agree on batch, sequence and head dim"):
        select(q, k[:, :32], LighthouseConfig(**VALID))
    with pytest.raises(TypeError, match="^k must be a torch.Tensor, not list$"):
        select(q, k.tolist(), LighthouseConfig(**VALID))
    with pytest.raises(TypeError, match="^config must be a LighthouseConfig, not NoneType$"):
        LighthouseAttention(None)
    assert select(q, k, LighthouseConfig(**VALID)).index.shape[:2] == (1, 2)


@pytest.mark.parametrize("scorer", ["norm", "dilated"])
@pytest.mark.parametrize("selection", ["paper", "causal"])
def test_a_nan_in_one_key_leaves_the_rows_before_it_finite_as_dense_sdpa_does(scorer, selection):
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, scorer=scorer, dilation=2, selection=selection)
    q, k, v = random_qkv(1, 128, 4, 2, 8)
    k[0, 77, 1, 3] = float("nan")
    o = lighthouse_attention(q, k, v, config)
    assert torch.isfinite(o[:, :77]).all()
    assert torch.isnan(o[:, 77:]).any()  # the coarsest entry holding the key is in every later row's view


def test_the_input_checks_trace_without_a_break_when_sizes_are_symbolic():
    """A compiled layer recompiles with dynamic sizes when a validation batch differs from the training one;
    the checks must then build no message (Dynamo cannot join strings of symbolic sizes)."""
    q = torch.randn(2, 64, 4, 16)
    k, v = torch.randn(2, 64, 2, 16), torch.randn(2, 64, 2, 16)
    checked = torch.compile(lambda q, k, v: check_inputs(q, k, v) or q + 1, backend="eager", fullgraph=True,
                            dynamic=True)
    assert torch.equal(checked(q, k, v), q + 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the inputs here are on the CPU")
@pytest.mark.parametrize("setting, message", [
    ({"v": None}, r"^v is None: Lighthouse attention needs the values v \[B, N, G, D\] beside q and k$"),
    ({"implementation": "fused"}, r"^implementation='fused' needs CUDA inputs \(q is on cpu\) or TRITON_INTERPRET=1 "
                                  r"\(Triton's interpreter, for tests\); use implementation='auto' or 'reference'$"),
    ({"backend": "cudnn"}, r"^backend='cudnn' needs CUDA inputs \(they are on cpu\); use 'auto', 'flash' or 'math'$"),
    ({"backend": "efficient"}, r"^backend='efficient' needs CUDA inputs \(they are on cpu\)"),
], ids=["v-none", "fused-on-cpu", "cudnn-on-cpu", "efficient-on-cpu"])
def test_a_call_that_cannot_run_here_is_one_value_error_naming_the_argument(setting, message, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the fused kernels' CPU stand-in is for tests only
    q, k, v = random_qkv(1, 64, 4, 2, 8)
    v = setting.pop("v", v)
    with pytest.raises(ValueError, match=message):
        lighthouse_attention(q, k, v, LighthouseConfig(**VALID, **setting))


def test_levels_beyond_the_sequence_are_named_without_computing_the_huge_span():
    with pytest.raises(ValueError, match=r"^levels=1000000 is too many for any sequence: pool\*\*\(levels-1\) "
                                         r"\(pool=2\) must divide seq_len, whose positions count up to "
                                         r"2\*\*63 in int64$"):
        LighthouseConfig(**{**VALID, "levels": 1000000}).validate(64)


@pytest.mark.parametrize("seq_len, kind", [(64.0, "float"), (float("nan"), "float"), (3.5, "float"), ("512", "str"),
                                           (True, "bool"), (None, "NoneType"), (np.int64(64), "int64")], ids=repr)
def test_a_length_that_is_not_an_int_is_one_value_error_naming_it(seq_len, kind):
    config = LighthouseConfig(**VALID)
    for check in (config.validate, config.gathered_len):
        with pytest.raises(ValueError, match=rf"^seq_len={re.escape(repr(seq_len))} must be an int, not {kind}$"):
            check(seq_len)
