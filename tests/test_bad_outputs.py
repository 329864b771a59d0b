"""The GPU scripts' output paths and cp_throughput.py's --resume file are checked at start-up: a bad one ends the
script with exit code 2 and a last line on stderr naming the flag and the path, no traceback, before the script
asks for CUDA (these tests run where there is none) or does any work; each script runs in a process of its own.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .helpers import child_env
from .warm_python import run_python

DEBUG = "configs/debug.toml"
MAX_CONTEXT = ["max_context.py", "--config", DEBUG, "--gpus", "1", "--start", "512", "--resolution", "256",
               "--max-len", "512", "--compile", "off"]


def script(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    """`python scripts/NAME ARGS` ({tmp} is tmp_path) to its end, from the checkout."""
    return run_python([f"scripts/{name}", *(arg.format(tmp=tmp_path) for arg in args)], env=child_env(), timeout=120)


def refused(result: subprocess.CompletedProcess) -> str:
    """The last line on stderr of a script that must have ended with a usage error, without a traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.splitlines()[-1]


@pytest.mark.parametrize("args, flag", [
    (["cp_throughput.py", "--json", "{tmp}/file/cp.json"], "--json"),  # was: after the first variant trained
    (["cp_throughput.py", "--records", "docs/records/cp_throughput_k1536.json", "--plot", "{tmp}/file/cp.png"],
     "--plot"),  # was: FileExistsError after the tables were printed
    ([*MAX_CONTEXT, "--json", "{tmp}/file/max.json"], "--json"),  # was: after the first probe
    ([*MAX_CONTEXT, "--markdown", "{tmp}/file/max.md"], "--markdown"),  # was: after the whole search
    (["bench_attention.py", "--out", "{tmp}/file/bench"], "--out"),  # was: NotADirectoryError on a GPU
    (["flash_attn_check.py", "--out", "{tmp}/file/flash"], "--out"),  # was: NotADirectoryError on a GPU
    (["golden_losses.py", "--write", "{tmp}/file/golden.json"], "--write"),  # was: after the training run
], ids=["cp-throughput-json", "cp-throughput-plot", "max-context-json", "max-context-markdown", "bench-attention",
        "flash-attn-check", "golden-losses"])
def test_an_output_path_under_a_file_is_refused_naming_the_flag_before_cuda_or_any_work(tmp_path, args, flag):
    (tmp_path / "file").write_text("x")
    out = args[args.index(flag) + 1].format(tmp=tmp_path)
    line = refused(script(tmp_path, *args))
    assert f"error: argument {flag}: '{out}': {tmp_path / 'file'} is a file, not a folder" in line


@pytest.mark.parametrize("args, flag", [
    (["cp_throughput.py", "--json", "{tmp}/folder"], "--json"),  # was: IsADirectoryError after the first variant
    ([*MAX_CONTEXT, "--json", "{tmp}/folder"], "--json"),
    ([*MAX_CONTEXT, "--markdown", "{tmp}/folder"], "--markdown"),
    (["golden_losses.py", "--write", "{tmp}/folder"], "--write"),  # was: IsADirectoryError after the training run
], ids=["cp-throughput-json", "max-context-json", "max-context-markdown", "golden-losses"])
def test_an_existing_folder_named_as_the_file_to_write_is_refused_naming_the_flag(tmp_path, args, flag):
    (tmp_path / "folder").mkdir()
    line = refused(script(tmp_path, *args))
    assert f"error: argument {flag}: '{tmp_path / 'folder'}' is a folder, not a file" in line


@pytest.mark.parametrize("records, refusal", [
    ([1, 2], " holds a JSON array of number; expected this script's records (an array of objects)"),  # AttributeError
    ([{}], ": record 1 has no 'cp_degree'; --resume reads cp_degree, compile, runs of every record"),  # KeyError
    ([{"cp_degree": 1, "compile": False, "runs": [1]}], ": record 1's 'runs' is not an object of runs (each an "
                                                        "object)"),  # AttributeError
], ids=["not-objects", "missing-key", "runs-not-objects"])
def test_cp_throughput_resume_names_a_json_file_that_is_not_its_records_before_cuda(tmp_path, records, refusal):
    earlier = tmp_path / "cp.json"
    earlier.write_text(json.dumps(records))
    line = refused(script(tmp_path, "cp_throughput.py", "--json", str(earlier), "--resume"))
    assert line == f"error: --resume: --json {earlier}{refusal}"
