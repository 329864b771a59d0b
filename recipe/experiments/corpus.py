"""A real-text byte corpus from folders of Python sources, split into training and held-out documents.

The `.py` files under each source folder (UTF-8 only; `site-packages` below it skipped) are named
`<folder name>/<path inside it>`. With `documents="files"` every file is one document; with
`documents="packages"` every folder that holds files is one document, named after the folder: its own
files (not its subfolders') in path order, each after a line `# ---- <file name> ----`, so documents run to
hundreds of KB. A document goes to the held-out split when the SHA-1 of its name falls in 1/`heldout_every`
of the hash space, so the split is disjoint by file (or folder) and does not depend on the file list's
order. Training documents are shuffled with `seed` (so the data order is no curriculum by package);
held-out ones keep path order.

Writes `<out>/train/corpus.jsonl`, `<out>/heldout/corpus.jsonl` (records {"text", "path"}, the recipe's
`local` dataset reads them) and `<out>/manifest.json` (sources, Python version, per split: files,
documents, bytes and the mean, median and largest document in bytes).
"""
from __future__ import annotations

import hashlib
import json
import platform
import random
import statistics
from pathlib import Path
from typing import NamedTuple

DOCUMENTS = ("files", "packages")
FILE_HEADER = "# ---- {name} ----\n"  # starts each file inside a package document


def is_heldout(relative_path: str, every: int) -> bool:
    """Whether the document named `relative_path` belongs to the held-out split (1 in `every` by SHA-1)."""
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


class Document(NamedTuple):
    """One corpus record: a file, or a folder's files joined."""

    name: str  # what the held-out hash and the record's "path" use
    text: str
    files: int  # source files it is made of


def package_documents(files: list[tuple[str, str]]) -> list[Document]:
    """One document per folder of `files`: its own files in path order, each after a header naming it."""
    folders: dict[str, list[tuple[str, str]]] = {}
    for name, text in files:
        folders.setdefault(name.rpartition("/")[0], []).append((name, text))
    return [Document(folder, "".join(FILE_HEADER.format(name=name) + text + ("" if text.endswith("\n") else "\n")
                                     for name, text in sorted(members)), len(members))
            for folder, members in sorted(folders.items())]


def split_stats(documents: list[Document]) -> dict:
    """Files, documents, bytes and document sizes in bytes (mean, median, max) of one split."""
    sizes = [len(d.text.encode()) for d in documents]
    return {"files": sum(d.files for d in documents), "documents": len(documents), "bytes": sum(sizes),
            "document_bytes": {"mean": round(statistics.fmean(sizes), 1), "median": statistics.median(sizes),
                               "max": max(sizes)}}


def write_jsonl(path: Path, documents: list[Document]) -> None:
    """One {"text", "path"} record per document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for document in documents:
            f.write(json.dumps({"text": document.text, "path": document.name}) + "\n")


def corpus_digest(folder: Path) -> str:
    """One SHA-256 for every file under `folder`: that of `sha256sum`'s listing of them in path order, as
    `(cd <folder> && find . -type f | sort | xargs sha256sum | sha256sum)` prints it, so that a study can pin its
    corpus and a shell can check it."""
    listing = []
    for name in sorted(f"./{p.relative_to(folder).as_posix()}" for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(folder / name, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        listing.append(f"{digest.hexdigest()}  {name}\n")
    return hashlib.sha256("".join(listing).encode()).hexdigest()


def make_corpus(sources: list[Path], out: Path, heldout_every: int = 20, seed: int = 0,
                documents: str = "files", sources_option: str = "sources") -> dict:
    """Write the two splits and the manifest under `out`; returns the manifest. `documents`: "files" (one
    document per file) or "packages" (one per folder, its files concatenated). A ValueError about the sources
    names them by `sources_option` (a command line's flag)."""
    if heldout_every < 2:
        raise ValueError(f"heldout_every={heldout_every} must be >= 2 (1 would hold out every file)")
    if documents not in DOCUMENTS:
        raise ValueError(f"documents={documents!r} is not one of {DOCUMENTS}")
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"{sources_option} {[str(s) for s in sources]} share a folder name; documents are named "
                         "by it")
    files, skipped = [], []
    for source in sources:
        found, unreadable = collect(source)
        files += found
        skipped += unreadable
    docs = package_documents(files) if documents == "packages" else [Document(*file, 1) for file in files]
    heldout = [d for d in docs if is_heldout(d.name, heldout_every)]
    train = [d for d in docs if not is_heldout(d.name, heldout_every)]
    if not heldout or not train:
        raise ValueError(f"{sources_option} {[str(s) for s in sources]}: {len(files)} files give {len(train)} "
                         f"training and {len(heldout)} held-out documents ({documents}); both must be non-empty")
    random.Random(seed).shuffle(train)
    write_jsonl(out / "train" / "corpus.jsonl", train)
    write_jsonl(out / "heldout" / "corpus.jsonl", heldout)
    manifest = {
        "sources": [str(s) for s in sources],
        "python": platform.python_version(),
        "heldout_every": heldout_every,
        "seed": seed,
        "documents": documents,
        "skipped_not_utf8": len(skipped),
        **{f"{name}_{key}": value for name, split in (("train", train), ("heldout", heldout))
           for key, value in split_stats(split).items()},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
