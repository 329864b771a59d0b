#!/usr/bin/env bash
# Install what the tests need on a fresh CPU machine, then run them.
# A torch already installed (e.g. a CUDA build) is kept; otherwise the CPU build 2.13.0 is taken.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q -e ".[dev]"
# The kernels' CPU tests run in Triton's interpreter, pinned to the version the GPU stack ships with (torch 2.11).
python3 -c "import triton" 2>/dev/null || python3 -m pip install -q "triton==3.6.0"
export TRITON_INTERPRET=1
# The checkout's modules compiled once, into their __pycache__ folders: where PYTHONDONTWRITEBYTECODE is set, each of
# the suite's few hundred Python processes would compile them again on import.
env -u PYTHONDONTWRITEBYTECODE python3 -m compileall -q \
    train.py lighthouse lighthouse_kernels models recipe eval scripts tests >/dev/null
# The Quickstart's install as a user makes it (tests/minimal_env.py), where tests/test_documented_commands.py runs
# the documented CPU commands: built in the background while the suite runs (reused while pyproject.toml is the
# same); the tests wait for it, and a build no test needed is stopped at the end.
setsid python3 -m tests.minimal_env >/dev/null 2>&1 &
minimal_install=$!  # its own process group, pip included
trap 'kill -- "-$minimal_install" 2>/dev/null || true' EXIT
# Two workers, each taking whole test files (module fixtures such as a shared debug run are built once):
# most tests wait on training subprocesses, so two overlap well even on two cores. `-n 0` runs serially.
python3 -m pytest -q -n 2 --dist loadfile "$@"
