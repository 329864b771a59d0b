"""Train a byte-level BPE tokenizer on your own text and save it as a Hugging Face tokenizer folder, which
`[model] hf_assets_path` then selects (recipe/data/bpe.py).

    python scripts/make_tokenizer.py --data 'my_text/**/*.jsonl' --vocab-size 32000 --out assets/tokenizer

`--data` is a folder or glob of .txt/.jsonl/.json/.parquet files, read as `training.dataset = "local"` reads them;
documents that cannot be read are left out, counted and the first named in the line it prints, and `--data` without
a readable document is refused before anything is written.
The trainer holds every distinct pre-tokenized word of what it reads in memory, so a corpus of hundreds of MB can
exhaust a machine's RAM at a large vocabulary: `--max-bytes` trains on the documents in file order up to that much
text, as sentencepiece's `input_sentence_size` samples, and the script says where it stopped.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Iterable, Iterator

from eval.options import output_folder
from recipe.data.bpe import train_bpe
from recipe.data.loader import BadDocument, match_local_files, read_documents
from recipe.train.cli import ConfigError, as_config_error, exit_on_config_error


def up_to(texts: Iterable[str], max_bytes: int | None, read: dict[str, int]) -> Iterator[str]:
    """`texts` in order until `max_bytes` UTF-8 bytes are read (the document that reaches it included; all with
    None), counting documents and bytes in `read`, and `read["cut"]` 1 when a document was left unread."""
    for text in texts:
        if max_bytes is not None and read["bytes"] >= max_bytes:
            read["cut"] = 1
            return
        read["documents"] += 1
        read["bytes"] += len(text.encode())
        yield text


def readable(files: list[str], unreadable: list[BadDocument]) -> Iterator[str]:
    """The documents of `files` in order; those that cannot be read are left out and kept in `unreadable`."""
    for path in files:
        for doc in read_documents(path):
            if isinstance(doc, BadDocument):
                unreadable.append(doc)
            else:
                yield doc


def unread(unreadable: list[BadDocument]) -> str:
    """How many documents could not be read, and the first of them (where and why)."""
    first = unreadable[0]
    return f"{len(unreadable):,} document(s) that cannot be read, the first {first.where}: {first.reason}"


def main(argv: list[str] | None = None) -> Path:
    """Train and save the tokenizer; a bad option ends in one line (exit code 2)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder or glob of text files")
    p.add_argument("--vocab-size", type=int, required=True, help="entries, BOS and EOS included")
    p.add_argument("--out", type=output_folder, required=True, help="the folder to write")
    p.add_argument("--max-bytes", type=int, help="train on the documents in file order up to this many UTF-8 bytes "
                                                 "of text (default: all of --data)")
    args = p.parse_args(argv)
    if args.max_bytes is not None and args.max_bytes < 1:
        raise ConfigError(f"--max-bytes {args.max_bytes} must be at least 1 (leave it out to read all of --data)")
    read = {"documents": 0, "bytes": 0, "cut": 0}
    unreadable: list[BadDocument] = []
    with as_config_error():
        texts = readable(match_local_files(args.data, "--data"), unreadable)
        first = next(texts, None)  # before anything is written: a tokenizer of no text is no tokenizer
        if first is None:
            why = f" ({unread(unreadable)})" if unreadable else ""
            raise ConfigError(f"--data={args.data!r} holds no readable document{why}")
        out = train_bpe(up_to(itertools.chain([first], texts), args.max_bytes, read), args.vocab_size, args.out)
    stop = f"; --max-bytes {args.max_bytes:,} reached, the rest of --data not read" if read["cut"] else ""
    left_out = f"; left out {unread(unreadable)}" if unreadable else ""
    print(f"tokenizer of {args.vocab_size:,} entries at most -> {out}, trained on {read['documents']:,} documents "
          f"({read['bytes']:,} bytes){stop}{left_out}")
    return out


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
