"""The Quickstart's install as a user makes it: a fresh venv holding only what `pip install torch==2.13.0` and
`pip install -e ".[train]"` put there (no dev extra, no triton, no transformers), in which
tests/test_documented_commands.py runs the documented CPU commands.

The venv is built once per checkout, pyproject.toml and Python, under the temp folder, behind a file lock:
`python3 -m tests.minimal_env` (started by scripts/run_tests.sh in the background while the suite runs) and
the tests share one build; a later run reuses it. pip takes packages from the index (the network) as a
user's install does.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"  # the CPU build run_tests.sh installs where no torch is importable
EXTRA = "train"
READY = "ready"


def venv_folder() -> Path:
    """Where this checkout's venv lives: named by a hash of the checkout path, pyproject.toml and Python."""
    key = hashlib.sha256(b"\0".join([str(REPO).encode(), (REPO / "pyproject.toml").read_bytes(),
                                     sys.version.encode(), TORCH.encode()])).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"lighthouse-minimal-install-{key}"


def build_steps(folder: Path) -> list[list[str]]:
    """The commands that build the venv: the venv, then the Quickstart's two installs."""
    # pip compiles what it installs: where PYTHONDONTWRITEBYTECODE is set, imports would compile torch every run
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    return [[sys.executable, "-m", "venv", str(folder)], [*pip, TORCH], [*pip, "-e", f"{REPO}[{EXTRA}]"]]


def minimal_python() -> Path:
    """The venv's Python, building the venv first unless a finished build is there; RuntimeError naming the
    step and pip's last output if a step fails (no network, a dependency that does not resolve)."""
    folder = venv_folder()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the build is done; another process waits for it here
        if not (folder / READY).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            for step in build_steps(folder):
                run = subprocess.run(step, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
                if run.returncode != 0:
                    raise RuntimeError(f"building the minimal install: {' '.join(step)} exited {run.returncode}:\n"
                                       f"{(run.stdout + run.stderr)[-3000:]}")
            (folder / READY).write_text(f"{TORCH} and -e .[{EXTRA}] of {REPO}\n")
    return folder / "bin" / "python"


def minimal_env() -> dict[str, str]:
    """The environment of a command run in the venv: this one without PYTHONPATH (the editable install makes the
    checkout importable, as for a user), offline for the Hugging Face hub, one thread per process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


if __name__ == "__main__":
    print(minimal_python())
