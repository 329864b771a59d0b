"""Llama-3 whose attention runs Lighthouse except in `dense_layers`: the model, its arguments and flavors, and
its parallelize function (`recipe.train.train_spec` registers them with torchtitan as `llama3_lighthouse`)."""
from __future__ import annotations

from .args import BOS_ID, EOS_ID, NUM_BYTES, VOCAB_SIZE, LighthouseLlamaArgs, attention_flops_per_token
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
