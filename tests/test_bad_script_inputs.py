"""Bad inputs to the evaluation and benchmark scripts end as those of tests/test_bad_inputs.py do: exit code 2 and
a last line on stderr naming the flag and the value, no traceback, before any model loads or process group starts.

Most rows run the script in this process to its exit (`refused_line`, `script_exit_code`); the rows about
everything a script prints start it as a process of its own (`run_python`), so that the log lines of the libraries
show too.
"""
from __future__ import annotations

import random
import shutil
from argparse import ArgumentTypeError
from pathlib import Path

import pytest
import torch

from eval.options import torch_seed

from .helpers import REPO, child_env, refused_line, script_exit_code
from .warm_python import run_python

DEBUG = str(REPO / "configs" / "debug.toml")
CHECKPOINT_HINT = "(a step folder such as outputs/run/checkpoint/step-400)"
EVALUATION = ["--checkpoint", "{tmp}", "--data", "{tmp}", "--job.config_file", DEBUG]


@pytest.mark.parametrize("script, args, flag", [
    ("golden_losses.py", [], "--write"),  # was: IsADirectoryError '.' after the training run
    ("run_agreement.py", ["{tmp}", "{tmp}"], "--json"),  # was: IsADirectoryError '.' after the comparison
    ("heldout_loss.py", EVALUATION, "--out"),  # was: "PosixPath('.') has an empty name" after the scoring
    ("cp_parity.py", ["--device", "cpu"], "--profile"),  # was: a failed trace export after the timings
], ids=["golden-losses", "run-agreement", "heldout-loss", "cp-parity-profile"])
def test_an_empty_path_to_write_is_refused_naming_the_flag(tmp_path, monkeypatch, capsys, script, args, flag):
    argv = [arg.format(tmp=tmp_path) for arg in args] + [f"{flag}="]
    assert refused_line(script, argv, monkeypatch, capsys) == (f"{script}: error: argument {flag}: '' names no "
                                                               "file: give a path that ends in a file name")


@pytest.mark.parametrize("script, args", [
    ("heldout_loss.py", EVALUATION),
    ("niah.py", ["--checkpoint", "{tmp}", "--lengths", "256", "--job.config_file", DEBUG]),
], ids=["heldout-loss", "niah"])
@pytest.mark.parametrize("prefix", [".", "/", "./"])
def test_an_output_prefix_that_ends_in_no_name_is_refused_naming_the_flag(tmp_path, monkeypatch, capsys, script,
                                                                          args, prefix):
    argv = [arg.format(tmp=tmp_path) for arg in args] + ["--out", prefix]  # was: "has an empty name" after the work
    assert refused_line(script, argv, monkeypatch, capsys) == (f"{script}: error: argument --out: {prefix!r} names "
                                                               "no file: give a path that ends in a file name")


def test_an_empty_output_folder_is_refused_instead_of_writing_into_the_current_folder(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a document the tokenizer can learn from"}\n')
    monkeypatch.chdir(tmp_path)  # was: tokenizer.json and tokenizer_config.json written here, exit code 0
    argv = ["--data", str(corpus), "--vocab-size", str(random.randint(260, 400)), "--out="]
    assert refused_line("make_tokenizer.py", argv, monkeypatch, capsys) == (
        "make_tokenizer.py: error: argument --out: '' names no folder: give its path (. for the current folder)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]


def test_every_seed_torch_takes_is_a_seed_option_value():
    for seed in (-2**63, -1, 0, 2**64 - 1, random.randrange(-2**63, 2**64)):
        assert torch_seed(str(seed)) == seed
        torch.Generator().manual_seed(seed)


def test_a_seed_torch_refuses_is_refused_by_the_seed_option():
    for seed in (-2**63 - 1, 2**64, 2**64 + random.randrange(2**80), -2**63 - 1 - random.randrange(2**80)):
        with pytest.raises(ValueError, match="Overflow"):  # torch's own refusal of the seed
            torch.Generator().manual_seed(seed)
        with pytest.raises(ArgumentTypeError, match=rf"^{seed} is not a seed torch takes: give an integer in "
                                                    r"\[-2\*\*63, 2\*\*64 - 1\]$"):
            torch_seed(str(seed))


@pytest.mark.parametrize("script, args", [
    ("generate.py", ["--checkpoint", "{tmp}", "--job.config_file", DEBUG]),  # was: after the model loaded
    ("causality_audit.py", ["--checkpoint", "{tmp}", "--data", "{tmp}", "--out", "{tmp}/out"]),  # after 35 s
    ("dependence_probe.py", []),
    ("cp_parity.py", ["--device", "cpu"]),  # was: on every rank, once the process group had started
], ids=["generate", "causality-audit", "dependence-probe", "cp-parity"])
def test_a_seed_past_what_torch_takes_is_refused_naming_the_flag_before_anything_runs(tmp_path, monkeypatch, capsys,
                                                                                     script, args):
    seed = random.choice([2**64 + random.randrange(2**70), -2**63 - 1 - random.randrange(2**70)])
    argv = [arg.format(tmp=tmp_path) for arg in args] + [f"--seed={seed}"]
    # was: "Overflow when unpacking long long"
    assert refused_line(script, argv, monkeypatch, capsys) == (f"{script}: error: argument --seed: {seed} is not a "
                                                               "seed torch takes: give an integer in "
                                                               "[-2**63, 2**64 - 1]")


@pytest.mark.parametrize("args, refusal", [
    (["--batch", "0"], "argument --batch: 0 must be >= 1"),  # was: a traceback from lighthouse/inputs.py
    (["--heads", "0"], "argument --heads: 0 must be >= 1"),
    (["--head-dim", "-4"], "argument --head-dim: -4 must be >= 1"),
    (["--kv-heads", "0"], "argument --kv-heads: 0 must be >= 1"),
    (["--seq-len", "0"], "argument --seq-len: 0 must be >= 1"),
    (["--iters", "0"], "argument --iters: 0 must be >= 1"),  # was: "no median for empty data" after the run
    (["--warmup", "-1"], "argument --warmup: -1 must be >= 0"),
    (["--kv-heads", "3"], "--heads=8 is not a multiple of --kv-heads=3 (each kv head serves as many query heads)"),
    (["--heads", "12", "--kv-heads", "8"], "--heads=12 is not a multiple of --kv-heads=8 (each kv head serves as "
                                           "many query heads)"),
], ids=["batch", "heads", "head-dim", "kv-heads", "seq-len", "iters", "warmup", "kv-heads-not-dividing",
        "heads-not-a-multiple"])
def test_cp_parity_refuses_a_geometry_or_timing_it_cannot_run_in_its_arguments(monkeypatch, capsys, args, refusal):
    argv = ["--device", "cpu", *args]
    assert refused_line("cp_parity.py", argv, monkeypatch, capsys) == f"cp_parity.py: error: {refusal}"
    assert not torch.distributed.is_initialized()


def test_cp_parity_started_without_torchrun_says_to_start_it_with_torchrun(monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)  # was: "environment variable RANK expected, but not set"
    argv = ["--device", "cpu", "--seq-len", "4096", "--head-dim", "32", "--topk", "256", "--tile-budget", "32",
            "--dtype", "float32"]  # the gloo smoke run of its usage
    assert script_exit_code("cp_parity.py", argv, monkeypatch) == 2
    assert capsys.readouterr().err == ("error: cp_parity.py compares the layer split over ranks with one device's: "
                                       "start it with torchrun, e.g. torchrun --nproc_per_node=2 scripts/cp_parity.py "
                                       "--device cpu\n")
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("script, args", [
    ("heldout_loss.py", ["--data", "{tmp}", "--out", "{tmp}/out"]),  # was: "... has no run record"
    ("generate.py", []),
    ("niah.py", ["--lengths", "256", "--out", "{tmp}/out"]),  # was: torchtitan's defaults refused, another model
    ("causality_audit.py", ["--data", "{tmp}", "--out", "{tmp}/out"]),
], ids=["heldout-loss", "generate", "niah", "causality-audit"])
@pytest.mark.parametrize("exists", [False, True], ids=["missing", "a-file"])
def test_a_checkpoint_that_is_not_a_folder_is_named_as_such_without_a_config_file(tmp_path, monkeypatch, capsys,
                                                                                script, args, exists):
    checkpoint = tmp_path / random.choice(["step-400", "ckpt", "typo"])
    if exists:
        checkpoint.write_text("x")
    argv = ["--checkpoint", str(checkpoint), *(arg.format(tmp=tmp_path) for arg in args)]
    assert script_exit_code(script, argv, monkeypatch) == 2
    found = "it is a file" if exists else "it does not exist"
    assert capsys.readouterr().err == f"error: --checkpoint='{checkpoint}' is not a folder: {found} {CHECKPOINT_HINT}\n"


@pytest.mark.parametrize("script, args", [
    ("niah.py", ["--lengths", "256", "--out", "{tmp}/out"]),
    ("causality_audit.py", ["--data", "{tmp}", "--out", "{tmp}/out"]),
], ids=["niah", "causality-audit"])
def test_an_evaluation_without_a_config_file_or_run_record_says_so_in_one_line(tmp_path, script, args):
    step = tmp_path / "checkpoint" / f"step-{random.randint(1, 999)}"
    step.mkdir(parents=True)
    run = run_python([f"scripts/{script}", "--checkpoint", str(step), *(arg.format(tmp=tmp_path) for arg in args)],
                     env=child_env(), timeout=120)
    assert run.returncode == 2  # was: "HF assets path ./tests/assets/tokenizer does not exist!" first
    assert run.stderr == (f"error: {step} has no run record (no runs/<start time>/config.toml in a folder above it): "
                          "pass --job.config_file of the run that trained it\n")


def run_with_record(tmp_path: Path) -> Path:
    """A step folder (empty) of a run whose record is configs/debug.toml (training.seq_len 512)."""
    record = tmp_path / "run" / "runs" / "20260101T000000Z"
    record.mkdir(parents=True)
    shutil.copy(DEBUG, record / "config.toml")
    step = tmp_path / "run" / "checkpoint" / f"step-{random.randint(1, 999)}"
    step.mkdir(parents=True)
    return step


def test_niah_without_a_config_file_runs_the_job_of_the_checkpoints_run_record(tmp_path, monkeypatch, capsys):
    n = random.randint(513, 4096)  # past the record's training.seq_len: refused before the checkpoint loads
    argv = ["--checkpoint", str(run_with_record(tmp_path)), "--lengths", f"256,{n}", "--out", str(tmp_path / "out")]
    assert script_exit_code("niah.py", argv, monkeypatch) == 2
    assert capsys.readouterr().err == (f"error: --lengths=256,{n}: lengths [{n}] exceed training.seq_len=512, the "
                                       "model's RoPE table; pass --training.seq_len to extend it\n")


def test_causality_audit_without_a_config_file_runs_the_job_of_the_checkpoints_run_record(tmp_path, monkeypatch,
                                                                                          capsys):
    lookahead = random.randint(512, 4096)  # no position to sample in the record's windows of 512 tokens
    argv = ["--checkpoint", str(run_with_record(tmp_path)), "--data", str(tmp_path), "--out", str(tmp_path / "out"),
            "--lookaheads", f"1,{lookahead}"]
    assert script_exit_code("causality_audit.py", argv, monkeypatch) == 2
    assert capsys.readouterr().err == (f"error: --lookaheads=1,{lookahead}: lookahead {lookahead} leaves no position "
                                       "to sample in a window of 512 tokens (positions start at 32)\n")
