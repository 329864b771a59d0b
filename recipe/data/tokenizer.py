"""The job's tokenizer: the paper's byte tokenizer (the 256 byte values plus BOS and EOS, vocabulary 258) by
default, or any Hugging Face tokenizer when `[model] hf_assets_path` names a folder with `tokenizer.json`
(and `tokenizer_config.json` where present), loaded by torchtitan's `build_hf_tokenizer`. `"."` (the configs'
value), `""` and torchtitan's default (the key unset) mean bytes; a path that does not exist, or a folder with
tokenizer files but no `tokenizer.json`, is refused in one line rather than trained on bytes.

The model's vocabulary comes from the tokenizer (`model_vocab_size`): the byte flavors' 258, or a Hugging Face
tokenizer's size padded up to a multiple of `VOCAB_MULTIPLE` (a faster output layer; the padded ids are never
targets). BOS and EOS come from the tokenizer; one without them is refused in one line.
"""
from __future__ import annotations

import hashlib
import os
import re

import torch
from tokenizers import decoders
from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer, build_hf_tokenizer
from torchtitan.config.job_config import Model

from models.llama3_lighthouse.args import BOS_ID, EOS_ID, NUM_BYTES, VOCAB_SIZE

__all__ = ["BOS_ID", "EOS_ID", "NUM_BYTES", "TOKENIZER_FILES", "VOCAB_MULTIPLE", "VOCAB_SIZE", "ByteTokenizer",
           "build_byte_tokenizer", "build_tokenizer", "hf_tokenizer_folder", "tokenizer_setting", "model_vocab_size",
           "token_bytes", "tokenizer_fingerprint", "utf8_bytes"]

TOKENIZER_FILE = "tokenizer.json"
# The files of a Hugging Face tokenizer that an export copies back beside the weights.
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json")
BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a SentencePiece piece that stands for one byte
# Files of other tokenizer formats: a folder with one of them but no tokenizer.json meant a tokenizer.
OTHER_TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
                         "merges.txt", "vocab.txt")
BYTE_TOKENIZER_PATHS = ("", ".", Model().hf_assets_path)  # torchtitan's default names its own test assets
VOCAB_MULTIPLE = 64  # Llama-2 (32000), Llama-3 (128256), Mistral and Qwen vocabularies are multiples of it


class ByteTokenizer(BaseTokenizer):
    """UTF-8 bytes are the token ids 0..255; BOS = 256, EOS = 257."""

    def __init__(self) -> None:
        super().__init__()
        self.bos_id = BOS_ID
        self.eos_id = EOS_ID

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID] * add_bos + ids + [EOS_ID] * add_eos

    def decode(self, ids: list[int]) -> str:
        """Text of the byte ids; BOS/EOS are dropped and invalid UTF-8 becomes U+FFFD."""
        bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
        if bad:
            raise ValueError(f"token ids {bad[:8]} are outside the byte vocabulary 0..{VOCAB_SIZE - 1}")
        return bytes(i for i in ids if i < NUM_BYTES).decode("utf-8", errors="replace")

    def get_vocab_size(self) -> int:
        return VOCAB_SIZE


def build_byte_tokenizer(job_config=None) -> ByteTokenizer:
    """The byte tokenizer; it needs no assets, so the job config is not read."""
    return ByteTokenizer()


def tokenizer_setting(model: Model) -> str:
    """The setting that named the tokenizer's folder, as `key='value'`: `model.tokenizer_path` when the job set it
    (torchtitan copies the deprecated key into `model.hf_assets_path`), else `model.hf_assets_path`."""
    if model.tokenizer_path and model.tokenizer_path == model.hf_assets_path:
        return f"model.tokenizer_path={model.tokenizer_path!r}"
    return f"model.hf_assets_path={model.hf_assets_path!r}"


def hf_tokenizer_folder(job_config) -> str | None:
    """`model.hf_assets_path` when it holds a Hugging Face `tokenizer.json`; None (the byte tokenizer) for `"."`,
    `""`, torchtitan's default or a folder of other files (an HF weights folder without tokenizer files).
    ValueError naming the key for a path that does not exist, is no folder or an empty folder (a tokenizer not
    yet copied there), or a folder with another tokenizer format's files but no `tokenizer.json`."""
    path = job_config.model.hf_assets_path
    if os.path.isfile(os.path.join(path, TOKENIZER_FILE)):
        return path
    if path in BYTE_TOKENIZER_PATHS:
        return None
    where = tokenizer_setting(job_config.model)
    if not os.path.isdir(path) or not os.listdir(path):
        what = ("is an empty folder" if os.path.isdir(path) else
                "is a file, not a folder" if os.path.exists(path) else "does not exist")
        raise ValueError(f"{where} {what}: point it at a folder with a Hugging Face {TOKENIZER_FILE}, or set it to "
                         "\".\" for the byte tokenizer")
    others = [name for name in OTHER_TOKENIZER_FILES if os.path.exists(os.path.join(path, name))]
    if others:
        raise ValueError(f"{where} holds {', '.join(others)} but no {TOKENIZER_FILE}, the file the recipe reads: "
                         f"write it with transformers (AutoTokenizer.from_pretrained(folder).save_pretrained(folder) "
                         f"saves a fast tokenizer's {TOKENIZER_FILE}), or set it to \".\" for the byte tokenizer")
    return None


def build_tokenizer(job_config) -> BaseTokenizer:
    """TrainSpec hook: the Hugging Face tokenizer of `model.hf_assets_path` if it has tokenizer files, else the
    byte tokenizer. ValueError naming the key for a tokenizer that cannot be read or lacks BOS or EOS (documents
    are packed as BOS text EOS)."""
    if hf_tokenizer_folder(job_config) is None:
        return ByteTokenizer()
    where = tokenizer_setting(job_config.model)
    try:
        tokenizer = build_hf_tokenizer(job_config)
    except Exception as err:  # noqa: BLE001  (the tokenizers library raises its own exception types)
        raise ValueError(f"{where}: its tokenizer cannot be loaded "
                         f"({type(err).__name__}: {' '.join(str(err).split())})") from err
    missing = [name for name in ("bos", "eos") if getattr(tokenizer, f"{name}_id") is None]
    if missing:
        raise ValueError(f"{where}: the tokenizer names no {' and '.join(missing).upper()} token "
                         f"(documents are packed as BOS text EOS); set {', '.join(f'{m}_token' for m in missing)} in "
                         "its tokenizer_config.json")
    return tokenizer


def ids_needed(tokenizer: BaseTokenizer) -> int:
    """How many ids the tokenizer's tokens take: its vocabulary, and BOS and EOS wherever they lie."""
    return max(tokenizer.get_vocab_size(), tokenizer.bos_id + 1, tokenizer.eos_id + 1)


def model_vocab_size(tokenizer: BaseTokenizer) -> int:
    """The model's vocabulary for `tokenizer`: the byte vocabulary (258) as it is, a Hugging Face tokenizer's ids
    (`ids_needed`) padded up to a multiple of VOCAB_MULTIPLE."""
    if isinstance(tokenizer, ByteTokenizer):
        return VOCAB_SIZE
    return -(-ids_needed(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def tokenizer_fingerprint(tokenizer: BaseTokenizer) -> str:
    """What identifies the tokenizer's ids: "byte", or "hf:<vocabulary>:<sha256 prefix of tokenizer.json>", so a
    checkpoint is never resumed with another tokenizer of the same size."""
    if not isinstance(tokenizer, HuggingFaceTokenizer):
        return "byte"
    with open(os.path.join(tokenizer.tokenizer_path, TOKENIZER_FILE), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return f"hf:{tokenizer.get_vocab_size()}:{digest}"


def utf8_bytes(text: str) -> int:
    """The UTF-8 length of `text`: the denominator of bits per byte, which compares models across tokenizers."""
    return len(text.encode("utf-8"))


def piece_bytes(piece: str, byte_level: bool) -> int:
    """The UTF-8 bytes a vocabulary piece decodes to: one a character under a byte-level decoder (each stands for a
    byte), else one for a byte-fallback piece `<0xNN>` and the UTF-8 length with SentencePiece's `▁` as a space."""
    if byte_level:
        return len(piece)
    return 1 if BYTE_FALLBACK.fullmatch(piece) else utf8_bytes(piece.replace("\u2581", " "))


def token_bytes(tokenizer: BaseTokenizer) -> torch.Tensor:
    """The UTF-8 bytes of each token id's text, int64 [model_vocab_size(tokenizer)]: the denominator of bits per
    byte over tokens. 1 for the byte tokenizer's bytes; 0 for BOS, EOS, other special tokens and padding ids.
    Exact for byte-level BPEs (GPT-2, Llama 3, Qwen, recipe.data.bpe) and added tokens; `piece_bytes` says how
    SentencePiece pieces count."""
    table = torch.zeros(model_vocab_size(tokenizer), dtype=torch.long)
    if isinstance(tokenizer, ByteTokenizer):
        table[:NUM_BYTES] = 1
        return table
    hf = tokenizer.tokenizer  # torchtitan's HuggingFaceTokenizer wraps a `tokenizers.Tokenizer`
    byte_level = isinstance(hf.decoder, decoders.ByteLevel)
    for piece, i in hf.get_vocab(with_added_tokens=False).items():
        table[i] = piece_bytes(piece, byte_level)
    for i, added in hf.get_added_tokens_decoder().items():
        table[i] = 0 if added.special else utf8_bytes(added.content)
    return table
