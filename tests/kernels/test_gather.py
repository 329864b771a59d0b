"""The fused gather copies the reference's rows, and its backward is autograd's through pooling and gather."""
import pytest
import torch

pytest.importorskip("triton")

from lighthouse import LighthouseConfig, gather_subsequence, pool_pyramid
from lighthouse.testing import assert_close
from ..helpers import DEVICE, KERNEL_DTYPES, random_qkv
from ..kernel_inputs import random_selection

from lighthouse_kernels.gather import gather_pyramid
from lighthouse_kernels.ordering import decode, packed_dtype
from lighthouse_kernels.pyramid import pool_and_score

# (batch, seq_len, heads, kv_heads, dim, levels, pool, topk, tile_budget)
CASES = [(2, 128, 4, 2, 16, 3, 2, 16, 4), (1, 256, 2, 2, 24, 3, 4, 8, 4), (1, 64, 2, 1, 8, 2, 2, 8, 4)]
CASE_IDS = [f"B{c[0]}-N{c[1]}-H{c[2]}-G{c[3]}-D{c[4]}-L{c[5]}-p{c[6]}-k{c[7]}-m{c[8]}" for c in CASES]


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("b, n, h, g, d, levels, pool, topk, budget", CASES, ids=CASE_IDS)
def test_gather_of_stored_levels_copies_their_rows_and_its_gradient_equals_reference(
        b, n, h, g, d, levels, pool, topk, budget, dtype):
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection="paper")
    q, k, v = random_qkv(b, n, h, g, d, dtype=dtype, device=DEVICE, requires_grad=True)
    packed, slots, flat = random_selection(b, g, n, config)
    with torch.no_grad():
        pyramid = pool_and_score(q, k, v, pool, levels, scores=False)
    fast = gather_pyramid(q, k, v, pyramid, packed, slots, pool, levels)
    sizes = [n // pool**lvl for lvl in range(1, levels)]
    for x, pooled, out in zip((q, k, v), pyramid[:3], fast):
        # the same pooled rows go in, so the copies are exact
        assert torch.equal(out, gather_subsequence([x.detach(), *pooled.split(sizes, dim=1)], flat))

    grads_out = [torch.randn_like(t) for t in fast]
    grads = torch.autograd.grad(fast, (q, k, v), grads_out)
    ref = [gather_subsequence(pool_pyramid(x, pool, levels), flat) for x in (q, k, v)]
    ref_grads = torch.autograd.grad(ref, (q, k, v), grads_out)
    for name, r, f in zip(("dq", "dk", "dv"), ref_grads, grads):
        assert_close(name, r, f, dtype)


# (batch, seq_len, heads, kv_heads, dim, levels, pool, topk, tile_budget): L >= 3, so a level can be recomputed
RECOMPUTE_CASES = [(2, 128, 4, 2, 16, 3, 2, 16, 4), (1, 256, 2, 2, 24, 4, 2, 16, 4), (1, 256, 2, 1, 8, 3, 4, 8, 4)]


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("b, n, h, g, d, levels, pool, topk, budget", RECOMPUTE_CASES,
                         ids=[f"N{c[1]}-L{c[5]}-p{c[6]}" for c in RECOMPUTE_CASES])
def test_gather_recomputes_unstored_levels_as_their_token_means(b, n, h, g, d, levels, pool, topk, budget, dtype):
    config = LighthouseConfig(levels=levels, pool=pool, topk=topk, tile_budget=budget, selection="paper")
    q, k, v = random_qkv(b, n, h, g, d, dtype=dtype, device=DEVICE, requires_grad=True)
    packed, slots, flat = random_selection(b, g, n, config)
    coarsest_only = 1 << (levels - 1)
    with torch.no_grad():
        pyramid = pool_and_score(q, k, v, pool, levels, scores=False, stored=coarsest_only)
    assert pyramid.stored == coarsest_only and pyramid.q.shape[1] == n // pool ** (levels - 1)
    fast = gather_pyramid(q, k, v, pyramid, packed, slots, pool, levels)
    ref = [gather_subsequence(pool_pyramid(x, pool, levels), flat) for x in (q, k, v)]
    for name, r, f in zip(("q~", "k~", "v~"), ref, fast):
        assert_close(name, r, f, dtype)

    grads_out = [torch.randn_like(t) for t in fast]
    grads = torch.autograd.grad(fast, (q, k, v), grads_out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grads_out)
    for name, r, f in zip(("dq", "dk", "dv"), ref_grads, grads):
        assert_close(name, r, f, dtype)


def test_packed_keys_are_int32_where_they_fit_and_the_gather_and_decode_take_either_width():
    assert packed_dtype(2**20, 3) == torch.int32  # 2^20 * 4 * 3 < 2^31
    assert packed_dtype(2**28, 3) == torch.int64
    b, n, h, g, d, levels, pool = 1, 256, 2, 1, 8, 3, 4
    config = LighthouseConfig(levels=levels, pool=pool, topk=8, tile_budget=4, selection="paper")
    q, k, v = random_qkv(b, n, h, g, d, dtype=torch.float32, device=DEVICE)
    packed, slots, _ = random_selection(b, g, n, config)
    assert packed.dtype == torch.int32
    wide = packed.long()
    assert all(torch.equal(x, y) for x, y in zip(decode(wide, pool, levels), decode(packed, pool, levels)))
    pyramid = pool_and_score(q, k, v, pool, levels, scores=False, stored=1 << (levels - 1))
    narrow_rows = gather_pyramid(q, k, v, pyramid, packed, slots, pool, levels)
    wide_rows = gather_pyramid(q, k, v, pyramid, wide, slots, pool, levels)
    assert all(torch.equal(x, y) for x, y in zip(narrow_rows, wide_rows))
