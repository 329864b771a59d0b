"""A real-text byte corpus from folders of Python sources (default: this interpreter's standard library).

The split, the document modes and the files written are described in `recipe.experiments.corpus`: every `.py` file (or,
with `--documents packages`, every folder's own files joined) is one document, held out by the SHA-1 of its
name (1 in `--heldout-every`); training documents are shuffled with `--seed`.

    python scripts/make_corpus.py --out outputs/replicate/corpus
    python scripts/make_corpus.py --out corpus --source /usr/lib/python3.12 --source .../site-packages/numpy
    python scripts/make_corpus.py --out corpus-long --documents packages

Writes `<out>/train/corpus.jsonl`, `<out>/heldout/corpus.jsonl` and `<out>/manifest.json`, which it also
prints.
"""
from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from eval.options import int_at_least, output_folder
from recipe.experiments.corpus import DOCUMENTS, make_corpus


def main() -> None:
    """Build the corpus the options describe and print its manifest."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, action="append",
                   help="a folder of .py files (repeat for several; default: this Python's standard library)")
    p.add_argument("--out", type=output_folder, required=True)
    p.add_argument("--heldout-every", type=lambda text: int_at_least(text, 2), default=20,
                   help="hold out 1 document in N (at least 2: 1 would hold out every document)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--documents", choices=DOCUMENTS, default="files",
                   help="one document per file, or per folder (its files concatenated in path order)")
    args = p.parse_args()
    sources = args.source or [Path(sysconfig.get_paths()["stdlib"])]
    if missing := [str(s) for s in sources if not s.is_dir()]:
        p.error(f"--source {missing}: not a folder")
    try:
        manifest = make_corpus(sources, args.out, args.heldout_every, args.seed, args.documents,
                               sources_option="--source")
    except ValueError as err:  # the sources do not make a corpus (the message names them by the flag)
        p.error(str(err))
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
