"""Export the recipe's model as a Hugging Face Llama folder (transformers, lm-eval-harness, vLLM load it).

The model is torchtitan's Llama-3 with only the inner attention call swapped, so after stage 2 it is a plain
Llama: `config.json` gives the flavor's dimensions and torchtitan's RoPE (its llama3 frequency scaling is always
on), the weights are converted by the TrainSpec's state dict adapter (torchtitan's `Llama3StateDictAdapter`:
key names and the q/k row permutation for Hugging Face's rotate-half RoPE) and saved as `model.safetensors`.

The byte tokenizer becomes a `tokenizers` byte-level BPE without merges: byte b is token b, BOS 256, EOS 257;
decoding turns invalid UTF-8 into U+FFFD as ByteTokenizer.decode does. `AutoTokenizer` prepends BOS (training
documents start with it) and adds no EOS, so `tokenizer(text).input_ids == ByteTokenizer().encode(text,
add_eos=False)`; with `split_special_tokens` a literal "<bos>" in the text stays bytes, as in the recipe.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from torchtitan.config import JobConfig
from torchtitan.protocols.train_spec import get_train_spec

from models.llama3_lighthouse import LighthouseLlama
from recipe.tokenizer import BOS_ID, EOS_ID, NUM_BYTES

BOS_TOKEN, EOS_TOKEN = "<bos>", "<eos>"
RECORD_FILE = "lighthouse_export.json"


def hf_config(model: LighthouseLlama) -> dict:
    """config.json of a transformers `LlamaForCausalLM` with the model's dimensions, RoPE and vocabulary."""
    args = model.model_args
    rope = args.rope_scaling_args
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": model.layers["0"].feed_forward.w1.out_features,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads or args.n_heads,
        "head_dim": args.dim // args.n_heads,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": args.norm_eps,
        "max_position_embeddings": args.max_seq_len,
        "rope_theta": args.rope_theta,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": rope.scaling_factor,
            "low_freq_factor": rope.low_freq_factor,
            "high_freq_factor": rope.high_freq_factor,
            "original_max_position_embeddings": rope.original_max_position_embeddings,
        },
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "tie_word_embeddings": False,
        "torch_dtype": str(model.tok_embeddings.weight.dtype).removeprefix("torch."),
    }


def hf_weights(model: LighthouseLlama, job_config: JobConfig) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face Llama names and RoPE layout, by the TrainSpec's state dict adapter."""
    adapter = get_train_spec(job_config.model.name).state_dict_adapter(model.model_args, None)
    return adapter.to_hf(model.state_dict())


def byte_tokenizer() -> Tokenizer:
    """recipe/tokenizer.py's ByteTokenizer as a `tokenizers` Tokenizer (the encoding that prepends BOS)."""
    # The byte-level pre-tokenizer writes byte b as a printable character: chr(b) where that is in its alphabet,
    # else the alphabet's characters from U+0100 on, in byte order. BPE without merges maps each to b.
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    shifted = iter(sorted(char for char in alphabet if ord(char) >= NUM_BYTES))
    byte_chars = [chr(b) if chr(b) in alphabet else next(shifted) for b in range(NUM_BYTES)]
    vocab = {char: b for b, char in enumerate(byte_chars)} | {BOS_TOKEN: BOS_ID, EOS_TOKEN: EOS_ID}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token in (BOS_TOKEN, EOS_TOKEN)])
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS_TOKEN} $A",
                                                             special_tokens=[(BOS_TOKEN, BOS_ID)])
    return tokenizer


def tokenizer_config(model_max_length: int) -> dict:
    """tokenizer_config.json: a fast tokenizer over tokenizer.json whose special tokens in text stay bytes."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }


def export(model: LighthouseLlama, job_config: JobConfig, out: Path, record: dict) -> None:
    """Write config.json, model.safetensors, tokenizer.json, tokenizer_config.json and `record` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(hf_weights(model, job_config), str(out / "model.safetensors"), metadata={"format": "pt"})
    byte_tokenizer().save(str(out / "tokenizer.json"))
    files = {"config.json": hf_config(model), "tokenizer_config.json": tokenizer_config(model.model_args.max_seq_len),
             RECORD_FILE: record}
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2, default=str) + "\n")
