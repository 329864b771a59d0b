"""`--model.flavor hf`: the model's shape and RoPE from `config.json` in `[model] hf_assets_path`, so any Hugging
Face Llama folder trains, or imports with `checkpoint.initial_load_in_hf`, without a flavor added to the code."""
from __future__ import annotations

import json
import os
from typing import Any

from torchtitan.models.llama3.model.args import RoPEScalingArgs

from models.llama3_lighthouse import LighthouseLlamaArgs
from recipe.hf.refusals import HF_CONFIG_FILE

HF_FLAVOR = "hf"


def read_shape_config(job_config) -> dict[str, Any]:
    """`config.json` of `model.hf_assets_path`; ValueError (one line) if it is missing or not a Llama's."""
    folder = job_config.model.hf_assets_path
    where = (f"model.flavor='{HF_FLAVOR}' takes the model's shape from {HF_CONFIG_FILE} in "
             f"model.hf_assets_path={folder!r}")
    path = os.path.join(folder or "", HF_CONFIG_FILE)
    if not folder or not os.path.isfile(path):
        raise ValueError(f"{where}, which has none: point model.hf_assets_path at a Hugging Face Llama folder")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where}, which cannot be read ({type(err).__name__}: {err})") from err
    if not isinstance(config, dict) or config.get("model_type") != "llama":
        kind = config.get("model_type") if isinstance(config, dict) else type(config).__name__
        raise ValueError(f"{where}, whose model_type is {kind!r}; only Llama models ('llama') have this shape")
    return config


def rope_settings(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, llama3 scaling or None for none) of `config.json`: transformers 5 writes `rope_parameters` (theta
    inside, `rope_type` "default" for none), earlier versions `rope_theta` and `rope_scaling`."""
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict):
        theta = float(parameters.get("rope_theta", config.get("rope_theta", 10000.0)))
        return theta, None if parameters.get("rope_type", "default") == "default" else parameters
    return float(config.get("rope_theta", 10000.0)), config.get("rope_scaling") or None


def rope_scaling_args(config: dict[str, Any]) -> RoPEScalingArgs:
    """torchtitan's llama3 RoPE scaling for `config.json` (no scaling: factor 1, which scales nothing)."""
    _, scaling = rope_settings(config)
    if scaling is None:
        return RoPEScalingArgs(scaling_factor=1.0)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise ValueError(f"{HF_CONFIG_FILE} has rope_scaling type {kind!r}: torchtitan's Llama-3 has llama3 scaling "
                         "only")
    return RoPEScalingArgs(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                           float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]))


def apply_hf_shape(args: LighthouseLlamaArgs, config: dict[str, Any], rope: bool = True) -> None:
    """Set dim, layers, heads, kv heads, FFN width, norm epsilon, vocabulary and (with `rope`) RoPE of `args` from
    `config.json`; `args.hf_shape` then keeps that vocabulary and, unless `rope.change_imported`, that RoPE.

    torchtitan sizes the FFN as multiple_of * ceil(int(ffn_dim_multiplier * int(8 * dim / 3)) / multiple_of);
    multiple_of = intermediate_size with the multiplier that makes the inner value at most intermediate_size gives
    intermediate_size exactly."""
    try:
        dim, heads, ffn = (int(config["hidden_size"]), int(config["num_attention_heads"]),
                           int(config["intermediate_size"]))
        args.dim, args.n_layers, args.n_heads = dim, int(config["num_hidden_layers"]), heads
        args.n_kv_heads = int(config.get("num_key_value_heads") or heads)
        args.vocab_size = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{HF_CONFIG_FILE} of model.hf_assets_path lacks a usable {err} for "
                         f"model.flavor='{HF_FLAVOR}'")
    if (min(dim, heads, ffn, args.n_layers, args.n_kv_heads, args.vocab_size) < 1 or dim % heads
            or heads % args.n_kv_heads):
        raise ValueError(f"{HF_CONFIG_FILE} has hidden_size={dim}, num_attention_heads={heads}, num_key_value_heads="
                         f"{args.n_kv_heads}, intermediate_size={ffn}, num_hidden_layers={args.n_layers}: heads must "
                         "divide hidden_size and kv heads the heads, all positive")
    if config.get("head_dim", dim // heads) != dim // heads:
        raise ValueError(f"{HF_CONFIG_FILE} has head_dim={config['head_dim']}, but torchtitan's Llama-3 takes "
                         f"hidden_size / num_attention_heads = {dim // heads}")
    if config.get("tie_word_embeddings", False):
        raise ValueError(f"{HF_CONFIG_FILE} has tie_word_embeddings=true: torchtitan's Llama-3 has an output layer "
                         "of its own")
    args.multiple_of, args.ffn_dim_multiplier = ffn, ffn / int(8 * dim / 3)
    args.norm_eps = float(config.get("rms_norm_eps", 1e-6))
    if rope:
        args.rope_theta = rope_settings(config)[0]
        args.rope_scaling_args = rope_scaling_args(config)
    args.hf_shape = True
