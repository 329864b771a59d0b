"""The one-line refusal of a Hugging Face folder whose config.json describes another shape than the job's model,
shared by the full check (`recipe.hf.importer`) and the one train.py makes before torch and torchtitan import
(`recipe.train.hf_at_once`). Standard library only."""
from __future__ import annotations

from typing import Any

HF_CONFIG_FILE = "config.json"


def differing(config: dict[str, Any], expected: dict[str, Any], defaults: dict[str, Any] | None = None) -> list[str]:
    """The `expected` keys whose config.json value differs, as "key=value (the job: value)". An absent key takes
    its value in `defaults`, and as transformers reads it: `num_key_value_heads` the attention heads, `head_dim`
    the expected one (transformers derives it from the width and heads, which are compared themselves)."""
    defaults = {"num_key_value_heads": config.get("num_attention_heads"), "head_dim": expected.get("head_dim"),
                **(defaults or {})}
    found = {key: config.get(key, defaults.get(key)) for key in expected}
    return [f"{key}={found[key]} (the job: {value})" for key, value in expected.items() if found[key] != value]


def shape_refusal(path: str, differences: list[str], flavor: str, hf_assets_path: str) -> str:
    """Why `checkpoint.initial_load_path` = `path` cannot start a job of `flavor`: its config.json differs."""
    return (f"checkpoint.initial_load_path={path!r}: {HF_CONFIG_FILE} has {', '.join(differences)}: "
            f"model.flavor={flavor!r} with the tokenizer of model.hf_assets_path={hf_assets_path!r} is another shape; "
            "pick (or add in models/flavor_shapes.py) a flavor with its dimensions and point model.hf_assets_path at "
            "its tokenizer")
