"""Train a byte-level BPE tokenizer on your own text and save it as a Hugging Face tokenizer folder, which
`[model] hf_assets_path` then selects (recipe/data/bpe.py).

    python scripts/make_tokenizer.py --data 'my_text/**/*.jsonl' --vocab-size 32000 --out assets/tokenizer

`--data` is a folder or glob of .txt/.jsonl/.json/.parquet files, read as `training.dataset = "local"` reads them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recipe.data.bpe import train_bpe
from recipe.data.loader import BadDocument, match_local_files, read_documents
from recipe.train.cli import ConfigError, exit_on_config_error


def main(argv: list[str] | None = None) -> Path:
    """Train and save the tokenizer; a bad option ends in one line (exit code 2)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder or glob of text files")
    p.add_argument("--vocab-size", type=int, required=True, help="entries, BOS and EOS included")
    p.add_argument("--out", type=Path, required=True, help="the folder to write")
    args = p.parse_args(argv)
    try:
        files = match_local_files(args.data, "--data")
        texts = (doc for path in files for doc in read_documents(path) if not isinstance(doc, BadDocument))
        out = train_bpe(texts, args.vocab_size, args.out)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    print(f"tokenizer of {args.vocab_size:,} entries at most -> {out}")
    return out


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
