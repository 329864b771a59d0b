"""TrainSpec `llama3_lighthouse`: Llama-3 whose attention runs Lighthouse except in `dense_layers`."""
from __future__ import annotations

from torchtitan.components.loss import build_cross_entropy_loss
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.components.optimizer import build_optimizers
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.models.llama3 import Llama3StateDictAdapter
from torchtitan.protocols.train_spec import TrainSpec, register_train_spec

from recipe.data import build_lighthouse_dataloader
from recipe.metrics import build_lighthouse_metrics_processor
from recipe.tokenizer import EOS_ID, VOCAB_SIZE, build_byte_tokenizer
from recipe.validation import build_dense_shadow_validator

from .args import LighthouseLlamaArgs, attention_flops_per_token
from .model import LighthouseLlama, LighthouseLlamaAttention
from .parallelize import parallelize_lighthouse_llama

NAME = "llama3_lighthouse"

# The paper's FFN width is 1536. torchtitan's FeedForward turns hidden_dim = 4 * dim = 4096 into
# int(2/3 * 4096) = 2730, then int(0.5625 * 2730) = 1535, rounded up to a multiple of 256: 1536.
PAPER_FFN_HIDDEN = 1536

FLAVORS = {
    "debug": LighthouseLlamaArgs(
        dim=128, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=VOCAB_SIZE, multiple_of=64,
        rope_theta=500000, eos_id=EOS_ID,
    ),
    # The paper's shape ratios at about 1/16 of its parameters (d 384, 12 layers, 6 heads of dim 64, FFN 576):
    # the one-GPU recoverability replication.
    "small": LighthouseLlamaArgs(
        dim=384, n_layers=12, n_heads=6, vocab_size=VOCAB_SIZE, ffn_dim_multiplier=0.5625, multiple_of=64,
        rope_theta=500000, eos_id=EOS_ID,
    ),
    # A quarter of `small`'s non-embedding parameters (d 256, 8 layers, 4 heads of dim 64, FFN 384; 4.6M): long
    # contexts on one GPU with several tokens per parameter in minutes (the time-to-quality study).
    "tiny": LighthouseLlamaArgs(
        dim=256, n_layers=8, n_heads=4, vocab_size=VOCAB_SIZE, ffn_dim_multiplier=0.5625, multiple_of=64,
        rope_theta=500000, eos_id=EOS_ID,
    ),
    "paper": LighthouseLlamaArgs(
        dim=1024, n_layers=30, n_heads=8, vocab_size=VOCAB_SIZE, ffn_dim_multiplier=0.5625, multiple_of=256,
        rope_theta=500000, eos_id=EOS_ID,
    ),
}


def get_train_spec() -> TrainSpec:
    return TrainSpec(
        model_cls=LighthouseLlama,
        model_args=FLAVORS,
        parallelize_fn=parallelize_lighthouse_llama,
        pipelining_fn=pipeline_llm,
        build_optimizers_fn=build_optimizers,
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=build_lighthouse_dataloader,
        build_tokenizer_fn=build_byte_tokenizer,
        build_loss_fn=build_cross_entropy_loss,
        build_validator_fn=build_dense_shadow_validator,
        build_metrics_processor_fn=build_lighthouse_metrics_processor,
        state_dict_adapter=Llama3StateDictAdapter,
    )


register_train_spec(NAME, get_train_spec())

__all__ = [
    "FLAVORS",
    "NAME",
    "PAPER_FFN_HIDDEN",
    "LighthouseLlama",
    "LighthouseLlamaArgs",
    "LighthouseLlamaAttention",
    "attention_flops_per_token",
    "get_train_spec",
    "parallelize_lighthouse_llama",
]
