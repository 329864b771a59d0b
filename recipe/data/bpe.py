"""A byte-level BPE tokenizer trained locally with the `tokenizers` library, saved as a Hugging Face tokenizer
folder (`tokenizer.json`, `tokenizer_config.json`) that `[model] hf_assets_path` selects and transformers loads.

For measurements that need a vocabulary of a given size whatever the text (the cost of a 128K-entry output
layer), `exact=True` fills the vocabulary up to `vocab_size` with reserved special tokens when the text has too
few merges, as Llama-3 reserves its own.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS_TOKEN, EOS_TOKEN = "<|begin_of_text|>", "<|end_of_text|>"


def train_bpe(texts: Iterable[str], vocab_size: int, out: Path, exact: bool = False) -> Path:
    """Train a byte-level BPE of at most `vocab_size` entries (exactly, with `exact`) on `texts` and save it in
    `out`; returns `out`. BOS and EOS are its first two ids; it adds neither by itself (the recipe packs
    documents as BOS text EOS)."""
    if vocab_size < 258 + 2:
        raise ValueError(f"vocab_size={vocab_size} must be at least 260 (the 256 bytes, BOS, EOS and a merge)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS_TOKEN, EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    if exact and tokenizer.get_vocab_size() < vocab_size:
        start = tokenizer.get_vocab_size()
        tokenizer.add_special_tokens([f"<|reserved_{i}|>" for i in range(vocab_size - start)])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
              "pad_token": EOS_TOKEN, "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids", "attention_mask"]}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
