"""scripts/build_wheelhouse.sh: a wheelhouse built here installs the recipe into a fresh venv with no index.

The target is this machine's Python and platform with no extras (the project wheel, numpy and the build
backend), which keeps the download small; the full `--extras train` set goes through the same code path.
The fresh venv gets torch the way a GPU node does, already installed: the test links this interpreter's
torch and torch's own requirements into it, and nothing else.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from lighthouse import LighthouseConfig

REPO = Path(__file__).resolve().parents[1]


def test_help_prints_the_header_comment_and_no_code():
    out = subprocess.run(["bash", str(REPO / "scripts" / "build_wheelhouse.sh"), "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("Build a wheelhouse of everything the recipe needs")
    assert "set -euo" not in out.stdout and "#" not in out.stdout
    assert out.stdout.rstrip().endswith("build on Linux with the target's Python version when the set must "
                                        "match exactly.")


@pytest.mark.parametrize("argv, line", [
    (["--extras", "train,trian"], "build_wheelhouse.sh: --extras train,trian: the project has no extra 'trian' (it "
                                  "has: train, kernels, flash, hf, dev)"),
    (["--platform", ""], "build_wheelhouse.sh: --platform '': give a wheel platform tag, e.g. manylinux_2_28_x86_64"),
], ids=["misspelled-extra", "empty-platform"])
def test_an_extra_the_project_lacks_or_an_empty_platform_is_refused_before_any_build(tmp_path, argv, line):
    """pip only warned of an unknown extra and built a wheelhouse without it (an offline install then lacked its
    packages); an empty platform ended in pip's resolution error after the project's wheel was built."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "build_wheelhouse.sh"), *argv, "--out", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.splitlines() == [line]
    assert not (tmp_path / "w").exists()


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


def _torch_closure() -> list:
    """torch's distribution and those its requirements name (without extras), as installed here."""
    todo, found = ["torch"], {}
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            found[name] = dist = distribution(name)
        except PackageNotFoundError:
            continue
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


def _preinstall_torch(site_packages: Path) -> None:
    """Link torch and its own requirements into `site_packages`, as if the node's image shipped them."""
    for dist in _torch_closure():
        top_levels = {Path(str(path)).parts[0] for path in dist.files or []} - {"..", "__pycache__"}
        for name in top_levels:
            source = Path(dist.locate_file(name))
            if source.exists() and not (site_packages / name).exists():
                (site_packages / name).symlink_to(source)


@pytest.mark.slow
@pytest.mark.skipif(not _pypi_reachable(), reason="no network: the wheelhouse is built from PyPI")
def test_wheelhouse_installs_into_a_fresh_venv_without_an_index(tmp_path):
    house = tmp_path / "wheelhouse"
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    built = subprocess.run(
        ["bash", str(REPO / "scripts/build_wheelhouse.sh"), "--out", str(house), "--extras", "", "--python", python],
        env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    wheels = sorted(path.name for path in house.glob("*.whl"))
    names = {canonicalize_name(wheel.split("-")[0]) for wheel in wheels}
    assert {"lighthouse-recipe", "numpy", "setuptools"} <= names
    assert not {name for name in names if name == "torch" or name.startswith(("nvidia", "triton", "cuda"))}
    pins = [line for line in (house / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert {canonicalize_name(pin.split("==")[0]) for pin in pins} == names - {"lighthouse-recipe"}

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    venv_python = venv / "bin" / "python"
    site_packages = Path(subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    assert site_packages != Path(sysconfig.get_paths()["purelib"])
    _preinstall_torch(site_packages)

    # Only the wheelhouse: no index, and no pip configuration or environment adding other wheel sources.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env["PIP_CONFIG_FILE"] = os.devnull
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv_python), "install", "--no-index", "--find-links",
         str(house), "-e", str(REPO)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    probe = ("import lighthouse, numpy, torch\n"
             "print(numpy.__file__)\n"
             "print(lighthouse.__file__)\n"
             "print(lighthouse.LighthouseConfig(levels=3, pool=2, topk=32, tile_budget=16).gathered_len(512))\n")
    result = subprocess.run([str(venv_python), "-c", probe], env={**env, "PYTHONNOUSERSITE": "1"},
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    numpy_file, lighthouse_file, gathered = result.stdout.split()
    assert Path(numpy_file).is_relative_to(site_packages)  # numpy came from the wheelhouse
    assert Path(lighthouse_file).is_relative_to(REPO)  # the editable checkout, as on the node
    assert int(gathered) == LighthouseConfig(levels=3, pool=2, topk=32, tile_budget=16,
                                             selection="paper").gathered_len(512)
    shutil.rmtree(venv)
