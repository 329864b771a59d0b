"""train.py with the Lighthouse layers on the fused Triton kernels, plus the replication's `small` flavor.

Registers the TrainSpec `llama3_lighthouse_fused`: the recipe's `llama3_lighthouse` with every Lighthouse
call going through `kernels.fused_lighthouse_attention` when its inputs are on a GPU the kernels support
(the pure-PyTorch reference otherwise, e.g. on CPU). The swap happens in the parallelize function, on the
parameter-free `inner_lighthouse` module of each attention layer, so the state dict is the recipe's and
checkpoints move freely between the two TrainSpecs. Flavors: the recipe's (`debug`, `paper`) and `small`
(d 384, 12 layers, 6 heads of dim 64, FFN 576: the paper's shape ratios at 1/16 of its parameters).

    python scripts/train_fused.py --job.config_file configs/replicate/small.toml --training.steps 100
"""
from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import recipe  # noqa: E402,F401  (first: prepares torchtitan on machines without an accelerator)
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402
from torchtitan.protocols.train_spec import get_train_spec, register_train_spec  # noqa: E402

from lighthouse import LighthouseAttention  # noqa: E402
from models.llama3_lighthouse import (  # noqa: E402
    FLAVORS,
    NAME,
    LighthouseLlamaArgs,
    LighthouseLlamaAttention,
    parallelize_lighthouse_llama,
)
from recipe.tokenizer import EOS_ID, VOCAB_SIZE  # noqa: E402

FUSED_NAME = f"{NAME}_fused"

SMALL = LighthouseLlamaArgs(
    dim=384, n_layers=12, n_heads=6, vocab_size=VOCAB_SIZE, ffn_dim_multiplier=0.5625, multiple_of=64,
    rope_theta=500000, eos_id=EOS_ID,
)


class FusedLighthouseAttention(LighthouseAttention):
    """`LighthouseAttention` that runs the fused Triton path for CUDA inputs the kernels support."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from kernels import fused_lighthouse_attention, supports  # Triton is imported only where it runs

        if q.is_cuda and supports(q, self.config):
            return fused_lighthouse_attention(q, k, v, self.config)
        return super().forward(q, k, v)


def use_fused_kernels(model: nn.Module) -> int:
    """Replace the Lighthouse call of every Lighthouse layer by the fused one; returns how many were replaced."""
    replaced = 0
    for module in model.modules():
        if isinstance(module, LighthouseLlamaAttention) and module.inner_lighthouse is not None:
            module.inner_lighthouse = FusedLighthouseAttention(module.inner_lighthouse.config)
            replaced += 1
    return replaced


def parallelize_fused(model: nn.Module, parallel_dims: ParallelDims, job_config) -> nn.Module:
    """The recipe's parallelize function, after the swap (so activation checkpointing wraps the fused call)."""
    use_fused_kernels(model)
    return parallelize_lighthouse_llama(model, parallel_dims, job_config)


def register() -> None:
    """Register `llama3_lighthouse_fused` once (importing this module twice must not fail)."""
    try:
        get_train_spec(FUSED_NAME)
        return
    except ValueError:
        pass
    base = get_train_spec(NAME)
    register_train_spec(
        FUSED_NAME,
        dataclasses.replace(base, model_args={**FLAVORS, "small": SMALL}, parallelize_fn=parallelize_fused),
    )


register()

if __name__ == "__main__":
    runpy.run_path(str(REPO / "train.py"), run_name="__main__")  # train.py, with this TrainSpec registered
