"""Byte-level tokenizer, as in the paper: the 256 byte values plus BOS and EOS (vocabulary 258)."""
from __future__ import annotations

from torchtitan.components.tokenizer import BaseTokenizer

from models.llama3_lighthouse.args import BOS_ID, EOS_ID, NUM_BYTES, VOCAB_SIZE

__all__ = ["BOS_ID", "EOS_ID", "NUM_BYTES", "VOCAB_SIZE", "ByteTokenizer", "build_byte_tokenizer"]


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
    """TrainSpec hook: the byte tokenizer needs no assets, so the job config is not read."""
    return ByteTokenizer()
