"""The commit a measurement ran from, for the records benchmarks and evaluations write."""
from __future__ import annotations

import subprocess
from pathlib import Path


def source_commit(repo: Path) -> str:
    """Short hash of `repo`'s HEAD, with "-dirty" when tracked files differ from it; "unknown" outside git.

    "-dirty" matters when a tree is copied to another machine: the HEAD there may not be the code that ran.
    """
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0 or not head.stdout.strip():
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")
