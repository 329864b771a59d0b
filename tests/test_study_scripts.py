"""The study scripts (scripts/*.sh) refuse what bash would misread, in one line with exit code 2 before any work:
counts from the environment that are not whole numbers (bash arithmetic reads "abc" as a variable and 080 as
octal), a part given too few or too many arguments, and an output folder that is a part's name or a file."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .helpers import REPO


def script(tmp_path, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """`bash scripts/<argv>` from the checkout with only PATH, RUN and `env` set (no python3 is reached)."""
    return subprocess.run(["bash", *argv], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "RUN": str(tmp_path / "run"), "PYTHON": "false", **env})


@pytest.mark.parametrize("argv, name", [
    (["scripts/replicate.sh", "dense"], "STEPS"),
    (["scripts/replicate.sh", "dense"], "HELDOUT_WINDOWS"),
    (["scripts/causality_study.sh", "train"], "STEPS"),
    (["scripts/causality_study.sh", "audit"], "SAMPLES"),
    (["scripts/causality_study.sh", "audit"], "WINDOWS"),
    (["scripts/time_to_quality.sh", "dense", "0"], "STEPS"),
    (["scripts/time_to_quality_long.sh", "tasks"], "STEPS"),
], ids=["replicate-steps", "replicate-windows", "causality-steps", "causality-samples", "causality-windows",
        "time-to-quality-steps", "time-to-quality-long-steps"])
@pytest.mark.parametrize("value", ["abc", "080", "0", "-4", "1e3"])
def test_a_count_that_is_not_a_whole_number_is_named_before_any_work(tmp_path, argv, name, value):
    out = script(tmp_path, argv, **{name: value})
    assert out.returncode == 2 and out.stderr.splitlines() == [f"{name}={value} must be a whole number >= 1"]
    assert not (tmp_path / "run").exists()


USAGE = ("usage: scripts/time_to_quality.sh corpus | dense SEED | paper|causal SEED | stage1 SELECTION SEED | "
         "stage2 SELECTION SEED SWITCH")


@pytest.mark.parametrize("argv", [["dense"], ["causal"], ["stage1", "causal"], ["stage2", "causal", "0"],
                                  ["corpus", "extra"], ["dense", "0", "extra"], ["bogus"], []],
                         ids=["dense-no-seed", "arm-no-seed", "stage1-no-seed", "stage2-no-switch", "corpus-extra",
                              "dense-extra", "unknown-part", "no-part"])
def test_a_time_to_quality_part_with_other_arguments_than_its_own_prints_the_usage(tmp_path, argv):
    out = script(tmp_path, ["scripts/time_to_quality.sh", *argv])
    assert out.returncode == 2 and out.stderr.splitlines() == [USAGE]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("out_folder, line", [
    ("check", "flash_attn_measure.sh: OUT='check' names no output folder: give it first, then the parts"),
    ("", "flash_attn_measure.sh: OUT='' names no output folder: give it first, then the parts"),
    ("{tmp}/file", "flash_attn_measure.sh: OUT={tmp}/file is a file, not a folder"),
], ids=["part-as-out", "empty", "a-file"])
def test_flash_attn_measure_refuses_an_output_folder_that_is_a_part_or_a_file(tmp_path, out_folder, line):
    (tmp_path / "file").write_text("x")
    out = script(tmp_path, ["scripts/flash_attn_measure.sh", out_folder.format(tmp=tmp_path), "check"])
    assert out.returncode == 2 and out.stderr.splitlines() == [line.format(tmp=tmp_path)]


def test_the_long_study_corpus_stops_when_a_package_it_reads_is_missing(tmp_path):
    """Without site-packages (python -S) numpy is missing: the corpus is refused in one line, where it used to be
    built from the standard library alone, another corpus than the study's."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    out = script(tmp_path, ["scripts/time_to_quality_long.sh", "corpus"], PYTHON=str(python))
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["time_to_quality_long.sh: package 'numpy' is not installed (set CORPUS_SOURCES)"]
    assert not (tmp_path / "run").exists()
