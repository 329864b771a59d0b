"""Llama-3 whose attention runs Lighthouse except in `dense_layers`: the model, its arguments and flavors, and
its parallelize function (`recipe.train.train_spec` registers them with torchtitan as `llama3_lighthouse`)."""
from __future__ import annotations

from ..flavor_shapes import FLAVOR_SHAPES, ROPE_THETA
from .args import BOS_ID, EOS_ID, NUM_BYTES, VOCAB_SIZE, LighthouseLlamaArgs, attention_flops_per_token
from .model import LighthouseLlama, LighthouseLlamaAttention
from .parallelize import parallelize_lighthouse_llama

NAME = "llama3_lighthouse"

# The paper's FFN width is 1536. torchtitan's FeedForward turns hidden_dim = 4 * dim = 4096 into
# int(2/3 * 4096) = 2730, then int(0.5625 * 2730) = 1535, rounded up to a multiple of 256: 1536.
PAPER_FFN_HIDDEN = 1536

FLAVORS = {
    **{name: LighthouseLlamaArgs(**shape, vocab_size=VOCAB_SIZE, rope_theta=ROPE_THETA, eos_id=EOS_ID)
       for name, shape in FLAVOR_SHAPES.items()},
    # Shape and RoPE from config.json in [model] hf_assets_path (recipe.hf.shape fills it in before the model is built).
    "hf": LighthouseLlamaArgs(vocab_size=VOCAB_SIZE, eos_id=EOS_ID),
}

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "FLAVORS",
    "NAME",
    "NUM_BYTES",
    "PAPER_FFN_HIDDEN",
    "VOCAB_SIZE",
    "LighthouseLlama",
    "LighthouseLlamaArgs",
    "LighthouseLlamaAttention",
    "attention_flops_per_token",
    "parallelize_lighthouse_llama",
]
