"""A manifest beside each checkpoint: the size and CRC-32 of every file its save wrote (sizes only with
`[resilience] checksums = false`), and the data-parallel degree of the run that wrote it.

`manifest.json` is written last, after DCP's `.metadata`, and atomically (a rename), so a folder that has it
was written whole. A resume reads it before DCP reads anything: a manifest that cannot be read, a file that is
missing, shorter or longer, whose checksum differs (zeroed or flipped bytes) or that the manifest does not list
makes the step damaged, and so does a step without a manifest or whose manifest records no checksums (which a
flipped byte passes) unless the job loads unverified steps (`[checkpoint] load_unverified`); a different data-parallel
degree is named as such (each data-parallel rank
keeps its own data position in the checkpoint). In a job of several processes each rank checksums its share of
the files (a CRC-32 reads about 2 GiB/s on one core) and the ranks exchange what they found, so every rank
decides the same.
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


def _step_files(folder: str) -> list[str]:
    """The files of the checkpoint `folder` a manifest lists: all but the manifest itself."""
    return sorted(n for n in os.listdir(folder)
                  if n not in (MANIFEST, PARTIAL_MANIFEST) and os.path.isfile(os.path.join(folder, n)))


def write_manifest(folder: str, data_parallel_degree: int, checksums: bool = True) -> None:
    """Record the files of the checkpoint `folder` (each rank checksums its share; rank 0 writes). Called by
    every rank once the save has returned on all of them (DCP's save ends when every file is written)."""
    names = _step_files(folder)
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


class UnreadableManifest(ValueError):
    """A `manifest.json` that exists but is not a manifest (not JSON, no record of the files, an entry without
    its size)."""


def read_manifest(folder: str) -> dict | None:
    """The manifest of the checkpoint `folder`, None if it has none; UnreadableManifest saying why if it has
    one that cannot be read."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UnreadableManifest(f"{MANIFEST} cannot be read ({err.strerror})") from err
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError both
        raise UnreadableManifest(f"{MANIFEST} is not JSON ({type(err).__name__})") from err
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict):
        raise UnreadableManifest(f"{MANIFEST} has no record of the step's files")
    for name, entry in files.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int)):
            raise UnreadableManifest(f"{MANIFEST} records no size for {name}")
    if len({isinstance(entry.get("crc32"), int) for entry in files.values()}) > 1:  # a save checksums all or none
        raise UnreadableManifest(f"{MANIFEST} records checksums for some files only")
    degree = record.get("data_parallel_degree")
    if degree is not None and not (type(degree) is int and degree >= 1):
        raise UnreadableManifest(f"{MANIFEST} records data_parallel_degree={json.dumps(degree)}, not a number of ranks")
    return record


def has_checksums(manifest: dict) -> bool:
    """Whether the manifest records the CRC-32 of its files (a save with `[resilience] checksums = false` records
    sizes only, which a flipped byte passes)."""
    return all("crc32" in entry for entry in manifest["files"].values())


def unverified_reason(manifest: dict | None, checksums: bool) -> str | None:
    """Why loading a step of this manifest (None: it has none) would not verify its bytes, None if it would."""
    if manifest is None:
        return f"it has no {MANIFEST} (a save cut before its end, or written by another program)"
    if not has_checksums(manifest):
        return f"its {MANIFEST} records no checksums (saved with [resilience] checksums = false)"
    if not checksums:
        return "[resilience] checksums = false checks its file sizes only"
    return None


def _file_fault(folder: str, name: str, expected: dict, checksums: bool) -> str | None:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return f"{name} is missing"
    size = os.path.getsize(path)
    if size != expected["bytes"]:
        return f"{name} holds {size:,} bytes, the save wrote {expected['bytes']:,}"
    if checksums and "crc32" in expected and crc32(path) != expected["crc32"]:
        return f"{name} fails its checksum"
    return None


def manifest_faults(folder: str, manifest: dict, checksums: bool = True) -> list[str]:
    """What differs between the checkpoint `folder` and its manifest (a file it lacks, a file it does not list,
    sizes always, checksums if `checksums`), the same list on every rank; empty when intact. Collective when
    `checksums` (each rank checksums its share); sizes alone are checked by each rank on its own."""
    files = manifest["files"]
    unlisted = {name: f"{name} is not in {MANIFEST}" for name in _step_files(folder) if name not in files}
    if checksums:
        found = _gathered({name: fault for name in _share(sorted(files))
                           if (fault := _file_fault(folder, name, files[name], checksums))})
    else:
        found = {name: fault for name in files if (fault := _file_fault(folder, name, files[name], checksums))}
    found.update(unlisted)
    return [found[name] for name in sorted(found)]


def checkpoint_faults(folder: str, checksums: bool = True, unverified: bool = False) -> list[str]:
    """What makes the checkpoint `folder` damaged (`manifest_faults`), a manifest that cannot be read included,
    and, unless `unverified`, a missing manifest (every save of the recipe writes one, so a step without it is a
    save cut before its end, or another program's) or one without checksums: a step whose bytes cannot be
    verified never passes as verified. `checksums` false checks sizes only (`resume_step`: the resume checksums)."""
    try:
        manifest = read_manifest(folder)
    except UnreadableManifest as err:
        return [str(err)]
    if manifest is not None and (faults := manifest_faults(folder, manifest, checksums)):
        return faults
    if unverified or (manifest is not None and has_checksums(manifest)):
        return []
    return [f"{unverified_reason(manifest, True)}; [checkpoint] load_unverified = true loads such a step"]
