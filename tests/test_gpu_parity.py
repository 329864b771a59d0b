"""The GPU parity check (eval/benchmarks/gpu_parity.py, run on GPUs by scripts/gpu_parity.py) runs every check of a case
and passes on small cases (on CPU the kernels run in Triton's interpreter): it composes the layer through the
public entries only, so a change of them shows here before a GPU run."""
import pytest
import torch

pytest.importorskip("triton")

from eval.benchmarks import gpu_parity
from eval.benchmarks.gpu_parity import run_case

from .helpers import DEVICE

CASES = [
    (1, 128, 4, 2, 16, torch.float32, dict(levels=3, pool=2, topk=16, tile_budget=4, selection="paper")),
    (1, 128, 2, 1, 16, torch.float16, dict(levels=3, pool=2, topk=8, tile_budget=4, scorer="dilated", dilation=2,
                                           selection="paper")),
    (1, 128, 2, 1, 16, torch.float32, dict(levels=3, pool=2, topk=8, tile_budget=4, selection="causal")),
    (1, 128, 2, 1, 16, torch.float32, dict(levels=3, pool=2, topk=8, tile_budget=4, selection="strict")),
]


@pytest.mark.parametrize("case", CASES, ids=["norm-float32", "dilated-float16", "causal", "strict"])
def test_every_check_of_a_small_case_passes_on_cpu(case, capsys):
    assert run_case(*case, device=DEVICE.type)
    line = capsys.readouterr().out
    assert "select=exact" in line and "bit-identical(o, kernel grads)=True" in line and line.rstrip().endswith("OK")
    assert "not checked" not in line  # these small cases select alike: the public layer's error counts


def test_a_case_whose_public_layer_is_off_fails(monkeypatch, capsys):
    """The end-to-end check counts: the public fused layer with its output scaled by 1.5 fails the case, though
    the kernels' own checks pass."""
    public = gpu_parity.lighthouse_attention
    monkeypatch.setattr(gpu_parity, "lighthouse_attention", lambda *args: public(*args) * 1.5)
    assert not run_case(*CASES[0], device=DEVICE.type)
    line = capsys.readouterr().out
    assert "select=exact" in line and line.rstrip().endswith("FAIL")
