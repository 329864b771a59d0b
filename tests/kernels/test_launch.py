"""`launch` runs what `kernel[grid](...)` runs: a later launch reuses a compiled kernel only for arguments that
Triton would specialise the same way (dtype, 16-byte alignment, the values of plain arguments)."""
import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl

from ..helpers import DEVICE

from lighthouse_kernels.launch import _COMPILED, _specialisation, cdiv, launch, next_power_of_2


@triton.jit
def _scaled_copy(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * scale, mask=i < n)


def test_specialisation_tells_apart_what_triton_compiles_apart():
    x = torch.randn(64)
    assert _specialisation((x, 16)) == _specialisation((torch.randn(8), 16))
    assert _specialisation((x, 16)) != _specialisation((x[1:], 16))  # 4 bytes off: not 16-byte aligned
    assert _specialisation((x, 16)) != _specialisation((x.half(), 16))
    assert _specialisation((x, 16)) != _specialisation((x, 17))


def test_host_helpers_equal_tritons():
    for n in range(1, 3000):
        assert next_power_of_2(n) == triton.next_power_of_2(n)
        for block in (1, 16, 64, 1000):
            assert cdiv(n, block) == triton.cdiv(n, block)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="launches skip Triton's binding on CUDA only")
@pytest.mark.parametrize("offset", [0, 1, 4], ids=["aligned", "4B-off", "16B-off"])
@pytest.mark.parametrize("n", [1, 100, 128])
def test_repeated_launches_equal_triton_launches(offset, n):
    x = torch.randn(n + offset, device=DEVICE)[offset:]
    for scale in (1, 2, 3):
        expected = torch.empty_like(x)
        _scaled_copy[(triton.cdiv(n, 64),)](x, expected, n, scale, BLOCK=64)
        for _ in range(3):  # the first launch compiles, the later ones go direct
            y = torch.empty_like(x)
            launch(_scaled_copy, (triton.cdiv(n, 64),), x, y, n, scale, BLOCK=64)
            assert torch.equal(y, expected)
    assert any(key[0] is _scaled_copy for key in _COMPILED)
