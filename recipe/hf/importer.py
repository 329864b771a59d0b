"""Starting from a Hugging Face Llama folder (`--checkpoint.initial_load_path DIR --checkpoint.initial_load_in_hf`):
torchtitan loads its safetensors through the TrainSpec's state dict adapter (`Llama3StateDictAdapter`); this
module checks first, in one line, that the folder's `config.json` describes the job's model: the same shape
(`model.flavor` and the tokenizer's vocabulary) and the same RoPE (`[rope]`), since torchtitan would load weights
of another shape with a page of size mismatches and weights trained with another RoPE without a word; and that
its safetensors (their headers) hold one floating-point tensor for each of the model's parameters, since integer
tensors load as garbage weights and a tensor the model has no place for is dropped without a word.
"""
from __future__ import annotations

import glob
import json
import math
import os
from typing import Any

import torch
from torchtitan.models.llama3 import Llama3StateDictAdapter

from models.llama3_lighthouse import LighthouseLlama, LighthouseLlamaArgs

from recipe.hf.refusals import HF_CONFIG_FILE, differing, shape_refusal
from recipe.hf.shape import rope_settings


def read_hf_config(path: str) -> dict[str, Any]:
    """`config.json` of the folder `path` (checkpoint.initial_load_path), which must hold safetensors weights."""
    where = f"checkpoint.initial_load_path={path!r} with checkpoint.initial_load_in_hf"
    if not glob.glob(os.path.join(glob.escape(path), "*.safetensors")):
        raise ValueError(f"{where}: the folder holds no .safetensors weights (a Hugging Face Llama folder has "
                         "model.safetensors or model-*.safetensors beside config.json)")
    try:
        with open(os.path.join(path, HF_CONFIG_FILE), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{where}: {HF_CONFIG_FILE} cannot be read ({type(err).__name__}: {err})") from err
    if config.get("model_type") != "llama":
        raise ValueError(f"{where}: {HF_CONFIG_FILE} has model_type={config.get('model_type')!r}; only Hugging Face "
                         "Llama models ('llama') import into the recipe's Llama-3")
    return config


def shape_mismatches(config: dict[str, Any], args: LighthouseLlamaArgs, ffn_hidden: int) -> list[str]:
    """`config.json` keys whose value differs from the job's model (`args`, FFN width `ffn_hidden`), as
    "key=value (the job: value)"."""
    expected = {
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads or args.n_heads,
        "intermediate_size": ffn_hidden,
        "vocab_size": args.vocab_size,
        "head_dim": args.dim // args.n_heads,
        "rms_norm_eps": args.norm_eps,
        "tie_word_embeddings": False,  # torchtitan's Llama-3 has an output layer of its own
        "attention_bias": False,
        "mlp_bias": False,
    }
    return differing(config, expected, {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False})


def rope_mismatches(config: dict[str, Any], args: LighthouseLlamaArgs) -> tuple[list[str], str]:
    """(the RoPE settings of `config.json` that differ from the job's, the `[rope]` flags that carry them).

    No `rope_scaling` is llama3 scaling with factor 1; llama3 scaling compares the factor and the two wavelength
    bounds (original / low and original / high factor), which are what the frequencies depend on. Other scaling
    types have no torchtitan equivalent and are refused."""
    theta, scaling = rope_settings(config)
    scaling = scaling or {"rope_type": "llama3", "factor": 1.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        return [f"rope_scaling type {kind!r}"], "(none: torchtitan's Llama-3 has llama3 scaling only)"
    ours = args.rope_scaling_args
    theirs = (float(scaling["factor"]), scaling["original_max_position_embeddings"] / scaling["low_freq_factor"],
              scaling["original_max_position_embeddings"] / scaling["high_freq_factor"])
    mine = (ours.scaling_factor, ours.original_max_position_embeddings / ours.low_freq_factor,
            ours.original_max_position_embeddings / ours.high_freq_factor)
    wrong = [] if math.isclose(theta, args.rope_theta) else [f"rope_theta={theta} (the job: {args.rope_theta})"]
    if not all(math.isclose(a, b) for a, b in zip(theirs, mine)):
        wrong.append(f"rope_scaling={json.dumps(rope_settings(config)[1])} (the job: factor {ours.scaling_factor}, "
                     f"original_max_position_embeddings {ours.original_max_position_embeddings}, low_freq_factor "
                     f"{ours.low_freq_factor}, high_freq_factor {ours.high_freq_factor})")
    flags = (f"--rope.theta {theta} --rope.scaling_factor {scaling['factor']} --rope.low_freq_factor "
             f"{scaling['low_freq_factor']} --rope.high_freq_factor {scaling['high_freq_factor']} "
             f"--rope.original_max_position_embeddings {scaling['original_max_position_embeddings']}")
    return wrong, flags


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the dtypes weights are stored in
HEADER_BYTES = 8  # a safetensors file starts with the length of its JSON header, a little-endian u64
ROTARY_BUFFER = "rotary_emb.inv_freq"  # saved by older transformers; the adapter drops it (RoPE is recomputed)


def safetensors_tensors(path: str) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """Each tensor of the folder's `*.safetensors` files: name -> (file name, safetensors dtype, shape), read from
    the files' headers alone (no weight is read)."""
    found = {}
    for file in sorted(glob.glob(os.path.join(glob.escape(path), "*.safetensors"))):
        with open(file, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(HEADER_BYTES), "little")))
        found.update({name: (os.path.basename(file), entry["dtype"], tuple(entry["shape"]))
                      for name, entry in header.items() if name != "__metadata__"})
    return found


def expected_hf_shapes(args: LighthouseLlamaArgs) -> dict[str, tuple[int, ...]]:
    """The Hugging Face name and shape of each of the job's parameters, as the TrainSpec's state dict adapter maps
    them (on a meta model: no memory)."""
    with torch.device("meta"):
        params = dict(LighthouseLlama(args).named_parameters())
    return {name: tuple(t.shape) for name, t in Llama3StateDictAdapter(args, None).to_hf(params).items()}


def check_hf_tensors(path: str, args: LighthouseLlamaArgs, flavor: str) -> None:
    """The folder's tensors are floating-point weights, one of the parameter's shape for each parameter of the job's
    model (`args`, of `model.flavor` `flavor`): DCP would load integer tensors as values (garbage weights), skip a
    tensor the model has no place for without a word, and fail with a traceback on one the folder lacks or holds
    in another shape."""
    where = f"checkpoint.initial_load_path={path!r} with checkpoint.initial_load_in_hf"
    try:
        tensors = safetensors_tensors(path)
    except (OSError, ValueError, KeyError, TypeError) as err:  # a header that is not safetensors' JSON
        raise ValueError(f"{where}: its .safetensors headers cannot be read ({type(err).__name__}: {err})") from err
    integers = [(name, file, dtype) for name, (file, dtype, _) in sorted(tensors.items()) if dtype not in FLOAT_DTYPES]
    if integers:
        name, file, dtype = integers[0]
        raise ValueError(f"{where}: {file} stores {name} as {dtype} ({len(integers)} tensor(s) not in a floating-point "
                         f"dtype, {'/'.join(FLOAT_DTYPES)}): not weights the model can start from; save the folder in "
                         "float16, bfloat16 or float32")
    expected = expected_hf_shapes(args)
    extra = sorted(name for name in set(tensors) - set(expected) if not name.endswith(ROTARY_BUFFER))
    missing = sorted(set(expected) - set(tensors))
    for names, what in ((extra, f"holds {{}}, which model.flavor={flavor!r} has no parameter for"),
                        (missing, f"lacks {{}}, a parameter of model.flavor={flavor!r}")):
        if names:
            listed = names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")
            raise ValueError(f"{where}: the folder {what.format(listed)}: its weights are another model's; pick (or "
                             "add in models/llama3_lighthouse) a flavor of its shape")
    reshaped = [(name, tensors[name], shape) for name, shape in sorted(expected.items())
                if name in tensors and tensors[name][2] != shape]
    if reshaped:
        name, (file, _, saved), shape = reshaped[0]
        raise ValueError(f"{where}: {file} stores {name} of shape {list(saved)}, where model.flavor={flavor!r} has "
                         f"{list(shape)} ({len(reshaped)} tensor(s) of another shape): its config.json or flavor does "
                         "not describe these weights")


def check_hf_import(job_config, args: LighthouseLlamaArgs, ffn_hidden: int) -> None:
    """Raise ValueError (one line) if the Hugging Face folder the job starts from is not a Llama of the job's
    shape (`args`, FFN width `ffn_hidden`) and RoPE; torchtitan loads HF weights as weights only."""
    path = job_config.checkpoint.initial_load_path
    config = read_hf_config(path)
    where = f"checkpoint.initial_load_path={path!r}: {HF_CONFIG_FILE} has"
    if not job_config.checkpoint.initial_load_model_only:
        raise ValueError("checkpoint.initial_load_in_hf loads weights only: set checkpoint.initial_load_model_only "
                         "= true (the optimizer, LR schedule and data position start fresh)")
    shape = shape_mismatches(config, args, ffn_hidden)
    if shape:
        raise ValueError(shape_refusal(path, shape, job_config.model.flavor, job_config.model.hf_assets_path))
    check_hf_tensors(path, args, job_config.model.flavor)
    rope, flags = rope_mismatches(config, args)
    if rope and not job_config.rope.change_imported:
        raise ValueError(f"{where} {', '.join(rope)}: the weights were trained with another RoPE; carry it with "
                         f"{flags}, or pass --rope.change_imported to extend the context with this job's [rope]")
