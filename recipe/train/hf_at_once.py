"""The Hugging Face import checked on train.py's command line before torch and torchtitan import: a job that starts
from a Hugging Face folder (`checkpoint.initial_load_in_hf`) in a named flavor whose width, depth or heads its
config.json contradicts ends in one line at once, not after the imports. Everything else about the folder (FFN
width, vocabulary, RoPE, the safetensors) is left to the full check after the parse
(`recipe.hf.importer.check_hf_import`), and so is every value this cannot read. Standard library only."""
from __future__ import annotations

import json
import os
from typing import Sequence

from models.flavor_shapes import FLAVOR_SHAPES, hf_dimensions
from recipe.errors import ConfigError
from recipe.hf.refusals import HF_CONFIG_FILE, differing, shape_refusal
from recipe.train.cpu_size import job_switch, job_value, read_job_file


def check_hf_shape_at_once(args: Sequence[str]) -> None:
    """Raise ConfigError (`shape_refusal`) when the job of `args` would import a Hugging Face folder whose
    config.json gives a named flavor's width, depth or heads otherwise; nothing where the job loads no such
    folder (checkpointing off, or a checkpoint of its own to resume) or a value cannot be read here."""
    if {"--help", "-h"} & set(args):
        return
    try:
        toml_values = read_job_file(args)
        flavor, path = (job_value(args, toml_values, key) for key in ("model.flavor", "checkpoint.initial_load_path"))
        own = os.path.join(str(job_value(args, toml_values, "job.dump_folder")),
                           str(job_value(args, toml_values, "checkpoint.folder")))
        imports = (job_switch(args, toml_values, "checkpoint.enable")
                   and job_switch(args, toml_values, "checkpoint.initial_load_in_hf"))
        if not imports or not path or flavor not in FLAVOR_SHAPES or os.path.exists(own):
            return
        with open(os.path.join(str(path), HF_CONFIG_FILE), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, TypeError):
        return
    if not isinstance(config, dict):
        return
    if differences := differing(config, hf_dimensions(FLAVOR_SHAPES[flavor])):
        raise ConfigError(shape_refusal(str(path), differences, flavor,
                                        str(job_value(args, toml_values, "model.hf_assets_path"))))
