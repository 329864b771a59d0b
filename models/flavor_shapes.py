"""The named flavors' shapes as plain numbers, the one definition `models.llama3_lighthouse.FLAVORS` builds its
arguments from; no torch or torchtitan, so a command line can compare a Hugging Face folder's config.json with a
flavor before its heavy imports (`recipe.train.hf_at_once`)."""
from __future__ import annotations

ROPE_THETA = 500_000

FLAVOR_SHAPES: dict[str, dict[str, int | float]] = {
    "debug": {"dim": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 64},
    # The paper's shape ratios at about 1/16 of its parameters (d 384, 12 layers, 6 heads of dim 64, FFN 576):
    # the one-GPU recoverability replication.
    "small": {"dim": 384, "n_layers": 12, "n_heads": 6, "ffn_dim_multiplier": 0.5625, "multiple_of": 64},
    # A quarter of `small`'s non-embedding parameters (d 256, 8 layers, 4 heads of dim 64, FFN 384; 4.6M): long
    # contexts on one GPU with several tokens per parameter in minutes (the time-to-quality study).
    "tiny": {"dim": 256, "n_layers": 8, "n_heads": 4, "ffn_dim_multiplier": 0.5625, "multiple_of": 64},
    "paper": {"dim": 1024, "n_layers": 30, "n_heads": 8, "ffn_dim_multiplier": 0.5625, "multiple_of": 256},
}


def hf_dimensions(shape: dict[str, int | float]) -> dict[str, int]:
    """The config.json keys a flavor's `shape` fixes without the FFN formula or the tokenizer: width, depth, heads."""
    heads = int(shape["n_heads"])
    return {"hidden_size": int(shape["dim"]), "num_hidden_layers": int(shape["n_layers"]),
            "num_attention_heads": heads, "num_key_value_heads": int(shape.get("n_kv_heads", heads)),
            "head_dim": int(shape["dim"]) // heads}
