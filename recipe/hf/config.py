"""The files beside a Hugging Face Llama's weights that make the folder load in transformers (and lm-eval, vLLM):
`config.json`, `generation_config.json` and the tokenizer's files. `recipe/hf/export.py` writes them beside the
weights it converts, and the trainer beside torchtitan's safetensors when `[checkpoint] last_save_in_hf` is set.

`config.json` keeps torchtitan's RoPE frequencies bit for bit but states them so transformers loads them without a
warning: transformers wants llama3 scaling's `original_max_position_embeddings` (torchtitan: 8192) below
`max_position_embeddings` (the training length, which lm-eval also takes as its window), and the llama3
frequencies depend only on the ratios original / low_freq_factor and original / high_freq_factor, so the three
are divided by the same power of two (exact in floating point).

The byte tokenizer becomes a `tokenizers` byte-level BPE without merges: byte b is token b, BOS 256, EOS 257;
decoding turns invalid UTF-8 into U+FFFD as ByteTokenizer.decode does. With `split_special_tokens` a literal
"<bos>" in the text stays bytes, as in the recipe. EOS pads (left: generation continues the text's last byte).
It adds no BOS by default (tokenizer.json has no post-processor), because lm-eval (0.4.x) conditions every
document of a rolling-perplexity task on its own prefix token, the tokenizer's BOS: a tokenizer that added BOS too
would make lm-eval score log p(BOS | BOS) as part of each document. Loading with `add_bos_token=True`
(transformers 5) makes `tokenizer(text).input_ids == ByteTokenizer().encode(text, add_eos=False)`.

A job with a Hugging Face tokenizer (`[model] hf_assets_path`) gets its tokenizer files copied unchanged
(tokenizer.json, tokenizer_config.json, special_tokens_map.json where present) and its BOS/EOS ids in config.json,
EOS padding.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from models.llama3_lighthouse import LighthouseLlamaArgs

from recipe.data.tokenizer import BOS_ID, EOS_ID, NUM_BYTES, TOKENIZER_FILES, build_tokenizer, hf_tokenizer_folder

BOS_TOKEN, EOS_TOKEN = "<bos>", "<eos>"
PAD_TOKEN = EOS_TOKEN  # EOS pads: the byte vocabulary has no spare id, and padded positions are masked anyway


def rope_scaling(args: LighthouseLlamaArgs) -> dict:
    """transformers' llama3 `rope_scaling` for torchtitan's RoPE, stated with `original_max_position_embeddings`
    below the training length where halving it (and both frequency factors with it) can get it there."""
    rope = args.rope_scaling_args
    original, low, high = rope.original_max_position_embeddings, rope.low_freq_factor, rope.high_freq_factor
    while original >= args.max_seq_len and original % 2 == 0:
        original, low, high = original // 2, low / 2, high / 2
    return {"rope_type": "llama3", "factor": rope.scaling_factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": original}


def hf_config(args: LighthouseLlamaArgs, ffn_hidden: int, dtype: torch.dtype, bos_id: int = BOS_ID,
              eos_id: int = EOS_ID) -> dict:
    """config.json of a transformers `LlamaForCausalLM` with the model's dimensions (`args`, FFN width
    `ffn_hidden`), RoPE, vocabulary and weights' `dtype`, and the tokenizer's BOS and EOS (EOS pads)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": ffn_hidden,
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
        "rope_scaling": rope_scaling(args),
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def byte_tokenizer() -> Tokenizer:
    """recipe/data/tokenizer.py's ByteTokenizer as a `tokenizers` Tokenizer that adds no special tokens."""
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


def generation_config(bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> dict:
    """generation_config.json: the special tokens `generate` stops at and pads with, and greedy decoding, which
    `generate` does by default but `pipeline("text-generation")` does only when the model's config says so (it
    samples at temperature 0.7 otherwise)."""
    return {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, "do_sample": False}


def write_hf_files(out: Path, args: LighthouseLlamaArgs, ffn_hidden: int, dtype: torch.dtype, job_config) -> None:
    """Write config.json, generation_config.json and the job's tokenizer files (its Hugging Face tokenizer's, or the
    byte tokenizer's tokenizer.json and tokenizer_config.json) into the existing folder `out`, beside weights of
    the model of `args` (FFN width `ffn_hidden`) in `dtype`."""
    tokenizer = build_tokenizer(job_config)
    files = {"config.json": hf_config(args, ffn_hidden, dtype, tokenizer.bos_id, tokenizer.eos_id),
             "generation_config.json": generation_config(tokenizer.bos_id, tokenizer.eos_id)}
    source = hf_tokenizer_folder(job_config)
    if source is None:
        byte_tokenizer().save(str(out / "tokenizer.json"))
        files["tokenizer_config.json"] = tokenizer_config()
    else:
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), out / name)
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2) + "\n")
