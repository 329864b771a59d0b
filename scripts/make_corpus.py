"""A real-text byte corpus from folders of Python sources (default: this interpreter's standard library).

Every `.py` file under each `--source` folder (UTF-8 only; `site-packages` below it skipped) is one
document, named `<folder name>/<path inside it>`. A file goes to the held-out split when the SHA-1 of its
name falls in 1/`--heldout-every` of the hash space, so the split is disjoint by file and does not depend
on the file list's order. Training documents are
shuffled with `--seed` (so the data order is no curriculum by package); held-out ones keep path order.

    python scripts/make_corpus.py --out outputs/replicate/corpus
    python scripts/make_corpus.py --out corpus --source /usr/lib/python3.12 --source .../site-packages/numpy

Writes `<out>/train/corpus.jsonl`, `<out>/heldout/corpus.jsonl` (records {"text", "path"}, the recipe's
`local` dataset reads them) and `<out>/manifest.json` (source, Python version, counts, bytes).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import sysconfig
from pathlib import Path


def is_heldout(relative_path: str, every: int) -> bool:
    return int(hashlib.sha1(relative_path.encode()).hexdigest(), 16) % every == 0


def collect(source: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, text) of every UTF-8 `.py` file under `source` in path order, and the names skipped."""
    documents, skipped = [], []
    for path in sorted(source.rglob("*.py")):
        inside = path.relative_to(source)
        relative = f"{source.name}/{inside.as_posix()}"
        if "site-packages" in inside.parts or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            skipped.append(relative)
            continue
        if text.strip():
            documents.append((relative, text))
    return documents, skipped


def write_jsonl(path: Path, documents: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for relative, text in documents:
            f.write(json.dumps({"text": text, "path": relative}) + "\n")


def make_corpus(sources: list[Path], out: Path, heldout_every: int = 20, seed: int = 0) -> dict:
    """Write the two splits and the manifest under `out`; returns the manifest."""
    if heldout_every < 2:
        raise ValueError(f"heldout_every={heldout_every} must be >= 2 (1 would hold out every file)")
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"sources {[str(s) for s in sources]} share a folder name; documents are named by it")
    documents, skipped = [], []
    for source in sources:
        found, unreadable = collect(source)
        documents += found
        skipped += unreadable
    heldout = [d for d in documents if is_heldout(d[0], heldout_every)]
    train = [d for d in documents if not is_heldout(d[0], heldout_every)]
    if not heldout or not train:
        raise ValueError(f"{[str(s) for s in sources]}: {len(documents)} files give {len(train)} training and {len(heldout)} "
                         f"held-out documents; both must be non-empty")
    random.Random(seed).shuffle(train)
    write_jsonl(out / "train" / "corpus.jsonl", train)
    write_jsonl(out / "heldout" / "corpus.jsonl", heldout)
    manifest = {
        "sources": [str(s) for s in sources],
        "python": platform.python_version(),
        "heldout_every": heldout_every,
        "seed": seed,
        "skipped_not_utf8": len(skipped),
        **{f"{name}_{key}": value for name, split in (("train", train), ("heldout", heldout))
           for key, value in (("files", len(split)), ("bytes", sum(len(t.encode()) for _, t in split)))},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, action="append",
                   help="a folder of .py files (repeat for several; default: this Python's standard library)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--heldout-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    sources = args.source or [Path(sysconfig.get_paths()["stdlib"])]
    print(json.dumps(make_corpus(sources, args.out, args.heldout_every, args.seed), indent=2))


if __name__ == "__main__":
    main()
