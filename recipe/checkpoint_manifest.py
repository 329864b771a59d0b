"""A manifest beside each checkpoint: the size and CRC-32 of every file its save wrote, and the data-parallel
degree of the run that wrote it.

`manifest.json` is written last, after DCP's `.metadata`, and atomically (a rename), so a folder that has it
was written whole. A resume reads it before DCP reads anything: a file that is missing, shorter or longer, or
whose checksum differs (zeroed or flipped bytes) makes the step damaged, and a different data-parallel degree
is named as such (each data-parallel rank keeps its own data position in the checkpoint). In a job of several
processes each rank checksums its share of the files (a CRC-32 reads about 2 GiB/s on one core) and the
ranks exchange what they found, so every rank decides the same.
"""
from __future__ import annotations

import json
import os
import zlib
from typing import Any

import torch.distributed as dist

MANIFEST = "manifest.json"
PARTIAL_MANIFEST = f".{MANIFEST}.tmp"  # renamed to MANIFEST once written whole
CHUNK_BYTES = 16 * 2**20


def crc32(path: str) -> int:
    """The CRC-32 of a file's bytes, read in chunks (zlib releases the GIL while it sums)."""
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            value = zlib.crc32(chunk, value)
    return value


def _share(names: list[str]) -> list[str]:
    """This rank's share of `names` (every name in a job of one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return names
    return sorted(names)[dist.get_rank()::dist.get_world_size()]


def _gathered(part: dict) -> dict:
    """The union of every rank's `part` (this rank's alone without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return part
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    return {key: value for p in parts for key, value in p.items()}


def write_manifest(folder: str, data_parallel_degree: int, checksums: bool = True) -> None:
    """Record the files of the checkpoint `folder` (each rank checksums its share; rank 0 writes). Called by
    every rank once the save has returned on all of them (DCP's save ends when every file is written)."""
    names = sorted(n for n in os.listdir(folder)
                   if n not in (MANIFEST, PARTIAL_MANIFEST) and os.path.isfile(os.path.join(folder, n)))
    files = _gathered({name: {"bytes": os.path.getsize(os.path.join(folder, name)),
                              **({"crc32": crc32(os.path.join(folder, name))} if checksums else {})}
                       for name in _share(names)})
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    record = {"data_parallel_degree": data_parallel_degree, "files": files}
    tmp = os.path.join(folder, PARTIAL_MANIFEST)
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, MANIFEST))


def read_manifest(folder: str) -> dict | None:
    """The manifest of the checkpoint `folder`; None if it has none or it cannot be read."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


def _file_fault(folder: str, name: str, expected: dict, checksums: bool) -> str | None:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return f"{name} is missing"
    size = os.path.getsize(path)
    if size != expected.get("bytes"):
        return f"{name} holds {size:,} bytes, the save wrote {expected.get('bytes'):,}"
    if checksums and "crc32" in expected and crc32(path) != expected["crc32"]:
        return f"{name} fails its checksum"
    return None


def manifest_faults(folder: str, manifest: dict, checksums: bool = True) -> list[str]:
    """What differs between the checkpoint `folder` and its manifest (sizes always, checksums if `checksums`),
    the same list on every rank; empty when intact."""
    files = manifest["files"]
    found = _gathered({name: fault for name in _share(sorted(files))
                       if (fault := _file_fault(folder, name, files[name], checksums))})
    return [found[name] for name in sorted(found)]
