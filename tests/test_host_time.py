"""The host-time probe of the benchmark times every segment of the layer's autograd call, on any device."""
import pytest
import torch

pytest.importorskip("triton")

from eval.benchmarks.host_time import host_segments, segment_table
from lighthouse import LighthouseConfig
from tests.helpers import DEVICE, random_qkv

SEGMENTS = [
    "forward call (autograd.Function.apply around the stages)",
    "autograd.grad until the node's backward starts",
    "node's backward",
    "node's backward done until autograd.grad returns",
    "total",
    "the forward stages alone (fused_forward, no autograd)",
    "the backward stages alone (fused_backward, no autograd)",
    "an empty autograd.Function forward+backward (autograd's floor)",
]


def test_every_segment_is_timed_and_tabulated():
    # the kernels with direct attention ops here: cuDNN on CUDA, the flash kernel on CPU
    cuda = DEVICE.type == "cuda"
    config = LighthouseConfig(levels=3, pool=2, topk=8, tile_budget=4, backend="cudnn" if cuda else "flash",
                              selection="paper")
    dtype = torch.bfloat16 if cuda else torch.float32
    q, k, v = random_qkv(1, 64, 2, 2, 16, dtype=dtype, device=DEVICE, requires_grad=True)
    rows = dict(host_segments(q, k, v, torch.randn_like(q), config, calls=2, sync_every=2))
    assert list(rows) == SEGMENTS
    assert all(us > 0 for us in rows.values())  # each a time taken, never compared: timings live in benchmarks
    assert "| node's backward |" in segment_table(64, 8, list(rows.items()))
