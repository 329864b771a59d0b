"""Export the recipe's model as a Hugging Face Llama folder (transformers, lm-eval-harness, vLLM load it).

The model is torchtitan's Llama-3 with only the inner attention call swapped, so after stage 2 it is a plain
Llama: `config.json` gives the flavor's dimensions and torchtitan's RoPE (its llama3 frequency scaling is always
on), the weights are converted by the TrainSpec's state dict adapter (torchtitan's `Llama3StateDictAdapter`:
key names and the q/k row permutation for Hugging Face's rotate-half RoPE) and saved as `model.safetensors`.

`config.json` keeps torchtitan's RoPE frequencies bit for bit but states them so transformers loads them without a
warning: transformers wants llama3 scaling's `original_max_position_embeddings` (torchtitan: 8192) below
`max_position_embeddings` (the training length, which lm-eval also takes as its window), and the llama3
frequencies depend only on the ratios original / low_freq_factor and original / high_freq_factor, so the three
are divided by the same power of two (exact in floating point).

The byte tokenizer becomes a `tokenizers` byte-level BPE without merges: byte b is token b, BOS 256, EOS 257;
decoding turns invalid UTF-8 into U+FFFD as ByteTokenizer.decode does. With `split_special_tokens` a literal
"<bos>" in the text stays bytes, as in the recipe. EOS pads (left: generation continues the text's last byte).

The tokenizer adds no BOS by default (tokenizer.json has no post-processor), because lm-eval (0.4.x) conditions
every document of a rolling-perplexity task on its own prefix token, the tokenizer's BOS: a tokenizer that added
BOS too would make lm-eval score log p(BOS | BOS) as part of each document. Without it, lm-eval's rolling
log-likelihood of a document is the recipe's: bytes after BOS. Loading with `add_bos_token=True` (transformers 5)
makes `tokenizer(text).input_ids == ByteTokenizer().encode(text, add_eos=False)`, a training document's start.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from torchtitan.config import JobConfig
from torchtitan.protocols.train_spec import get_train_spec

from models.llama3_lighthouse import LighthouseLlama
from recipe.tokenizer import BOS_ID, EOS_ID, NUM_BYTES

BOS_TOKEN, EOS_TOKEN = "<bos>", "<eos>"
PAD_ID, PAD_TOKEN = EOS_ID, EOS_TOKEN  # the vocabulary has no spare id; padded positions are masked anyway
RECORD_FILE = "lighthouse_export.json"
WEIGHTS_FILE = "model.safetensors"


def rope_scaling(model: LighthouseLlama) -> dict:
    """transformers' llama3 `rope_scaling` for torchtitan's RoPE, stated with `original_max_position_embeddings`
    below the training length where halving it (and both frequency factors with it) can get it there."""
    args = model.model_args
    rope = args.rope_scaling_args
    original, low, high = rope.original_max_position_embeddings, rope.low_freq_factor, rope.high_freq_factor
    while original >= args.max_seq_len and original % 2 == 0:
        original, low, high = original // 2, low / 2, high / 2
    return {"rope_type": "llama3", "factor": rope.scaling_factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": original}


def hf_config(model: LighthouseLlama) -> dict:
    """config.json of a transformers `LlamaForCausalLM` with the model's dimensions, RoPE and vocabulary."""
    args = model.model_args
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
        "rope_scaling": rope_scaling(model),
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": False,
        "torch_dtype": str(model.tok_embeddings.weight.dtype).removeprefix("torch."),
    }


def hf_weights(model: LighthouseLlama, job_config: JobConfig) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face Llama names and RoPE layout, by the TrainSpec's state dict adapter."""
    adapter = get_train_spec(job_config.model.name).state_dict_adapter(model.model_args, None)
    return adapter.to_hf(model.state_dict())


def byte_tokenizer() -> Tokenizer:
    """recipe/tokenizer.py's ByteTokenizer as a `tokenizers` Tokenizer that adds no special tokens."""
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
    return tokenizer


def tokenizer_config() -> dict:
    """tokenizer_config.json: a fast tokenizer over tokenizer.json whose special tokens in text stay bytes, that
    adds no BOS unless asked, pads on the left with EOS and gives the model ids and attention mask only. It sets no
    length limit: bytes have none, and the model's is config.json's `max_position_embeddings`, which lm-eval
    reads; lm-eval tokenizes whole documents before it cuts them into windows, and a tokenizer limit of the
    model's length made transformers warn of "indexing errors" on every longer document."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "padding_side": "left",
        "model_input_names": ["input_ids", "attention_mask"],
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
    }


def generation_config() -> dict:
    """generation_config.json: the special tokens `generate` stops at and pads with, and greedy decoding, which
    `generate` does by default but `pipeline("text-generation")` does only when the model's config says so (it
    samples at temperature 0.7 otherwise)."""
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False}


def readable_by_umask(path: Path) -> None:
    """Give `path` the permissions a newly written file gets (0666 less the umask): safetensors writes 0600."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def export(model: LighthouseLlama, job_config: JobConfig, out: Path, record: dict) -> None:
    """Write config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
    `record` (as lighthouse_export.json) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(hf_weights(model, job_config), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    readable_by_umask(out / WEIGHTS_FILE)
    byte_tokenizer().save(str(out / "tokenizer.json"))
    files = {"config.json": hf_config(model), "generation_config.json": generation_config(),
             "tokenizer_config.json": tokenizer_config(), RECORD_FILE: record}
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2, default=str) + "\n")
