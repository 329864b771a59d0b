"""The job's tokenizer: the paper's byte tokenizer (the 256 byte values plus BOS and EOS, vocabulary 258) by
default, or any Hugging Face tokenizer when `[model] hf_assets_path` names a folder with `tokenizer.json`
(and `tokenizer_config.json` where present), loaded by torchtitan's `build_hf_tokenizer`.

The model's vocabulary comes from the tokenizer (`model_vocab_size`): the byte flavors' 258, or a Hugging Face
tokenizer's size padded up to a multiple of `VOCAB_MULTIPLE` (a faster output layer; the padded ids are never
targets). BOS and EOS come from the tokenizer; one without them is refused in one line.
"""
from __future__ import annotations

import hashlib
import os

from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer, build_hf_tokenizer

from models.llama3_lighthouse.args import BOS_ID, EOS_ID, NUM_BYTES, VOCAB_SIZE

__all__ = ["BOS_ID", "EOS_ID", "NUM_BYTES", "TOKENIZER_FILES", "VOCAB_MULTIPLE", "VOCAB_SIZE", "ByteTokenizer",
           "build_byte_tokenizer", "build_tokenizer", "hf_tokenizer_folder", "model_vocab_size", "tokenizer_fingerprint", "utf8_bytes"]

TOKENIZER_FILE = "tokenizer.json"
# The files of a Hugging Face tokenizer that an export copies back beside the weights.
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json")
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


def hf_tokenizer_folder(job_config) -> str | None:
    """`model.hf_assets_path` when it holds a Hugging Face `tokenizer.json`, else None (the byte tokenizer)."""
    path = job_config.model.hf_assets_path
    return path if path and os.path.isfile(os.path.join(path, TOKENIZER_FILE)) else None


def build_tokenizer(job_config) -> BaseTokenizer:
    """TrainSpec hook: the Hugging Face tokenizer of `model.hf_assets_path` if it has tokenizer files, else the
    byte tokenizer. ValueError naming the key for a tokenizer that cannot be read or lacks BOS or EOS (documents
    are packed as BOS text EOS)."""
    if hf_tokenizer_folder(job_config) is None:
        return ByteTokenizer()
    path = job_config.model.hf_assets_path
    try:
        tokenizer = build_hf_tokenizer(job_config)
    except Exception as err:  # noqa: BLE001  (the tokenizers library raises its own exception types)
        raise ValueError(f"model.hf_assets_path={path!r}: its tokenizer cannot be loaded "
                         f"({type(err).__name__}: {' '.join(str(err).split())})") from err
    missing = [name for name in ("bos", "eos") if getattr(tokenizer, f"{name}_id") is None]
    if missing:
        raise ValueError(f"model.hf_assets_path={path!r}: the tokenizer names no {' and '.join(missing).upper()} token "
                         f"(documents are packed as BOS text EOS); set {', '.join(f'{m}_token' for m in missing)} in "
                         "its tokenizer_config.json")
    return tokenizer


def model_vocab_size(tokenizer: BaseTokenizer) -> int:
    """The model's vocabulary for `tokenizer`: the byte vocabulary (258) as it is, a Hugging Face tokenizer's size
    padded up to a multiple of VOCAB_MULTIPLE."""
    if isinstance(tokenizer, ByteTokenizer):
        return VOCAB_SIZE
    size = max(tokenizer.get_vocab_size(), tokenizer.bos_id + 1, tokenizer.eos_id + 1)
    return -(-size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


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
