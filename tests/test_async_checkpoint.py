"""Asynchronous checkpoints (`--checkpoint.async_mode async`) get their manifests too: each asynchronous save's at the
next save (torchtitan waits for its files first), the last step's (saved synchronously) at once."""
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.checkpoint_manifest import manifest_faults, read_manifest
from recipe.launch import single_process_env

from .helpers import child_env

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_asynchronous_save_of_a_finished_run_has_a_manifest_its_files_pass(tmp_path):
    run = subprocess.run([sys.executable, "train.py", "--job.config_file", "configs/debug.toml", "--job.dump_folder",
                          str(tmp_path), "--training.steps", "6", "--checkpoint.enable", "--checkpoint.interval", "2",
                          "--checkpoint.async_mode", "async"],
                         cwd=REPO, env={**child_env(), **single_process_env(), "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for step in (2, 4, 6):
        folder = str(tmp_path / "checkpoint" / f"step-{step}")
        manifest = read_manifest(folder)
        assert manifest is not None, f"step-{step} has no manifest"
        assert manifest_faults(folder, manifest) == [] and ".metadata" in manifest["files"]
