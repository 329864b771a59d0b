"""The layer's op in two implementations behind one interface (`lighthouse.pipeline`): the pure-PyTorch
`plan`/`attend` (`lighthouse.reference`) and the fused ones (`lighthouse.fused`, Triton's interpreter on CPU)
take the same arguments and select the same entries, index for index, also for interleaved row groups with
and without the prefix guarantee and with the scores before each row (as context parallelism calls them);
the reference is `attend` of `plan`, and picking it imports no Triton.
"""
import dataclasses
import subprocess
import sys

import pytest
import torch

from lighthouse import LighthouseConfig, reference, reference_lighthouse_attention
from lighthouse.pipeline import FORCE_REFERENCE_ENV, pipeline_for
from lighthouse.testing import assert_close

from .helpers import DEVICE, REPO, child_env, fresh_seed, random_qkv, vectors_with_norms

# 4 rows, so that each of two interleaved row groups has more than one; one kv head of two query heads (the
# kernels' cost in Triton's interpreter grows with rows * kv heads)
ROWS, SEQ_LEN, HEADS, KV_HEADS, DIM = 4, 256, 2, 1, 8
PAPER = LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=4, selection="paper")
CAUSAL = LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="causal")
STRICT = LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2, selection="strict")


def _distinct_norm_qkv(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 q, k whose token norms are a random permutation of 1 + i/count: no two within float32
    rounding, so the pooling kernel's norms and the reference's rank tokens alike."""
    torch.manual_seed(seed)
    q, k = (vectors_with_norms(1 + torch.randperm(ROWS * SEQ_LEN * h).view(ROWS, SEQ_LEN, h).double()
                               / (ROWS * SEQ_LEN * h), DIM).float() for h in (HEADS, KV_HEADS))
    return q.to(DEVICE), k.to(DEVICE), torch.randn(ROWS, SEQ_LEN, KV_HEADS, DIM, device=DEVICE)


def _fixed_history(config: LighthouseConfig, seed: int):
    """A `ScoreHistory` giving every row the same distinct scores before it, within the range of the rows'."""
    halo = config.coarsest_span - 1
    gen = torch.Generator().manual_seed(seed)
    before = [(1 + torch.rand(ROWS, KV_HEADS, halo, generator=gen, dtype=torch.float64)).float().to(DEVICE)
              for _ in range(2)]
    return lambda sq, sk: (before[0], before[1])


def _caller_scores(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A caller's own level-0 scores (as context parallelism passes the dilated scorer's), all distinct."""
    gen, count = torch.Generator().manual_seed(seed), ROWS * KV_HEADS * SEQ_LEN
    return tuple((1 + torch.randperm(count, generator=gen).view(ROWS, KV_HEADS, SEQ_LEN) / count).float().to(DEVICE)
                 for _ in range(2))


CONFIGS = {"paper": PAPER, "causal": CAUSAL, "strict": STRICT}
PREFIXES = {"one-group": (True,), "TF": (True, False), "FT": (False, True)}
SCORES = ("pooling-pass", "caller")
# Every pair of the three axes, each value of one axis with each of another (9 of the 18 combinations; each
# takes seconds in Triton's interpreter): every selection with one row group and with both interleavings, every
# selection and every row grouping with the pooling pass's scores and with the caller's.
PLAN_CASES = [pytest.param(CONFIGS[c], PREFIXES[p], SCORES[(i + j) % 2], id=f"{SCORES[(i + j) % 2]}-{p}-{c}")
              for i, c in enumerate(CONFIGS) for j, p in enumerate(PREFIXES)]


@pytest.mark.parametrize("config, prefixes, scores", PLAN_CASES)
def test_naive_and_fused_plans_select_the_same_entries(config, prefixes, scores):
    fused = pytest.importorskip("lighthouse.fused")
    seed = fresh_seed()
    q, k, v = _distinct_norm_qkv(seed)
    given = _caller_scores(seed) if scores == "caller" else None
    history = _fixed_history(config, seed)
    naive, fast = (impl.plan(q, k, v, config, prefixes, given, history) for impl in (reference, fused))
    want, got = naive.selection(config), fast.selection(config)
    for field in ("level", "index", "expanded"):
        assert torch.equal(getattr(got, field).cpu(), getattr(want, field).cpu()), f"{field} (seed {seed})"


def test_naive_and_fused_attend_agree_on_a_plan_with_spill_and_attention_passed():
    fused = pytest.importorskip("lighthouse.fused")
    q, k, v = (x.half() for x in _distinct_norm_qkv(0))
    history, calls = _fixed_history(CAUSAL, 0), []

    def attention(q_t, k_t, v_t):
        calls.append(q_t.shape)
        return torch.nn.functional.scaled_dot_product_attention(
            *(x.repeat_interleave(q_t.shape[2] // x.shape[2], dim=2).transpose(1, 2) for x in (q_t, k_t, v_t)),
            is_causal=True).transpose(1, 2)

    scores = _caller_scores(0)  # the same selection for both: fp16 norms could tie
    outputs = [impl.attend(q, k, v, impl.plan(q, k, v, CAUSAL, (False, True), scores, history), CAUSAL,
                           spill=True, attention=attention, out_dtype=torch.float32)
               for impl in (reference, fused)]
    assert calls == [(ROWS, CAUSAL.gathered_len(SEQ_LEN), HEADS, DIM)] * 2
    assert [o.shape for o in outputs] == [(ROWS, SEQ_LEN + CAUSAL.coarsest_span - 1, HEADS, DIM)] * 2
    assert [o.dtype for o in outputs] == [torch.float32] * 2
    assert_close("o", outputs[0], outputs[1], torch.float16)


def test_the_reference_layer_is_attend_of_plan():
    q, k, v = random_qkv(2, 128, 4, 2, 8, seed=3)
    planned = reference.attend(q, k, v, reference.plan(q, k, v, PAPER), PAPER)
    assert torch.equal(reference_lighthouse_attention(q, k, v, PAPER), planned)


def test_pipeline_for_picks_the_implementation_resolve_implementation_names(monkeypatch):
    q = torch.zeros(1, 64, 2, 8)
    assert pipeline_for(q, PAPER) is reference  # "auto" on CPU
    fused = pytest.importorskip("lighthouse.fused")
    forced = LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=4, selection="paper", implementation="fused")
    assert pipeline_for(q, forced) is fused
    assert pipeline_for(q, dataclasses.replace(forced, levels=1)) is reference  # dense: the fused plan needs L >= 2
    monkeypatch.setenv(FORCE_REFERENCE_ENV, "1")
    assert pipeline_for(q, forced) is reference


def test_the_reference_and_its_cp_composition_import_no_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from lighthouse import LighthouseConfig, lighthouse_attention\n"
        "from lighthouse.pipeline import pipeline_for\n"
        "import lighthouse.context_parallel\n"
        "config = LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=4, selection='paper')\n"
        "q, k, v = torch.randn(1, 128, 2, 8), torch.randn(1, 128, 2, 8), torch.randn(1, 128, 2, 8)\n"
        "print(pipeline_for(q, config).__name__, lighthouse_attention(q, k, v, config).shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=child_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "lighthouse.reference"
