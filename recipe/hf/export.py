"""Export the recipe's model as a Hugging Face Llama folder (transformers, lm-eval-harness, vLLM load it).

The model is torchtitan's Llama-3 with only the inner attention call swapped, so after stage 2 it is a plain
Llama: the weights are converted by the TrainSpec's state dict adapter (torchtitan's `Llama3StateDictAdapter`: key
names and the q/k row permutation for Hugging Face's rotate-half RoPE) and saved as `model.safetensors`;
`recipe.hf.config` writes config.json (the flavor's dimensions and torchtitan's RoPE), generation_config.json and
the job's tokenizer files beside them, as the trainer does for `[checkpoint] last_save_in_hf`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torchtitan.config import JobConfig
from torchtitan.protocols.train_spec import get_train_spec

from models.llama3_lighthouse import LighthouseLlama
from recipe.hf.config import write_hf_files

RECORD_FILE = "lighthouse_export.json"
WEIGHTS_FILE = "model.safetensors"


def hf_weights(model: LighthouseLlama, job_config: JobConfig) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face Llama names and RoPE layout, by the TrainSpec's state dict adapter."""
    adapter = get_train_spec(job_config.model.name).state_dict_adapter(model.model_args, None)
    return adapter.to_hf(model.state_dict())


def readable_by_umask(path: Path) -> None:
    """Give `path` the permissions a newly written file gets (0666 less the umask): safetensors writes 0600."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def export(model: LighthouseLlama, job_config: JobConfig, out: Path, record: dict) -> None:
    """Write model.safetensors, config.json, generation_config.json, the tokenizer files (`recipe.hf.config`) and
    `record` (as lighthouse_export.json) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(hf_weights(model, job_config), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    readable_by_umask(out / WEIGHTS_FILE)
    write_hf_files(out, model.model_args, model.layers["0"].feed_forward.w1.out_features,
                   model.tok_embeddings.weight.dtype, job_config)
    (out / RECORD_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")
