"""Bad inputs to train.py stop at start-up with one line naming the key, before anything is built or written;
bad inputs to the scripts under scripts/ end the same way, naming the flag and its value.

Most rows call the trainer's start-up checks in this process (`check_start_up`: what LighthouseTrainer runs
before it builds or writes anything); a few start train.py itself for the contract around them: exit code 2,
one line on stderr, no traceback, nothing changed on disk. The scripts run in this process to their exit
(`script_exit_code`).
"""
import errno
import fcntl
import json
import logging
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchtitan.config.job_config import Model
from torchtitan.distributed import ParallelDims

import models  # noqa: F401  (before torchtitan; registers llama3_lighthouse)
from recipe.data.loader import DataError, LocalFiles, read_documents
from recipe.data.tokenizer import ByteTokenizer
from recipe.launch import single_process_env
from recipe.logs.metrics import LighthouseMetricsProcessor
from recipe.resilience.checkpoint_manifest import write_manifest
from recipe.resilience.dump_lock import LOCK_FILE, DumpFolderLock
from recipe.train.checks import check_launch
from recipe.train.cli import DEBUG_ENV, ConfigError, parse_job_config
from recipe.train.trainer import check_start_up

from .helpers import script_exit_code
from .warm_python import run_python

REPO = Path(__file__).resolve().parent.parent
DEBUG = str(REPO / "configs" / "debug.toml")


def parse(tmp_path: Path, *args: str):
    """configs/debug.toml writing into tmp_path/run, with `args` ({tmp} is tmp_path) on top."""
    return parse_job_config(["--job.config_file", DEBUG, "--job.dump_folder", str(tmp_path / "run"),
                             *(arg.format(tmp=tmp_path) for arg in args)])


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path below root with its size and modification time."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


def empty_files(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    for name in ("a.jsonl", "b.txt"):
        (tmp_path / "corpus" / name).touch()


def garbage_step_10(tmp_path: Path) -> None:
    """A step-10 whose `.metadata` is noise and which has no manifest: damaged, as a resume finds it."""
    (tmp_path / "run" / "checkpoint" / "step-10").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / "step-10" / ".metadata").write_bytes(os.urandom(64))


def checkpoint_at_step_10(tmp_path: Path, data_parallel_degree: int = 1) -> None:
    """A step-10 with its manifest, as the recipe saves it (its bytes are noise: the start-up checks read none)."""
    garbage_step_10(tmp_path)
    write_manifest(str(tmp_path / "run" / "checkpoint" / "step-10"), data_parallel_degree)


def previous_run(**settings: str | int):
    """A setup: a checkpoint at step 10 written by a run whose record holds `settings` ({"model.flavor": ...})."""
    def setup(tmp_path: Path) -> None:
        checkpoint_at_step_10(tmp_path)
        (tmp_path / "run" / "runs" / "20260101T000000Z").mkdir(parents=True)
        sections = {}
        for dotted, value in settings.items():
            section, key = dotted.split(".")
            sections.setdefault(section, []).append(f"{key} = {json.dumps(value)}")
        text = "".join(f"[{section}]\n" + "\n".join(lines) + "\n" for section, lines in sections.items())
        (tmp_path / "run" / "runs" / "20260101T000000Z" / "config.toml").write_text(text)
    return setup


def garbage_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / ".metadata").write_bytes(os.urandom(256))


def persistent_id_checkpoint(tmp_path: Path) -> None:
    """A .metadata whose unpickling error spans two lines (a persistent id with no persistent_load)."""
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / ".metadata").write_bytes(b"Px\n.")


def nothing(tmp_path: Path) -> None:
    pass


def written_by(data_parallel_degree: int):
    """A setup: a checkpoint at step 10 whose manifest says `data_parallel_degree` ranks wrote it."""
    return lambda tmp_path: checkpoint_at_step_10(tmp_path, data_parallel_degree)


def parquet_with(column: str):
    """A setup: tmp_path/corpus.parquet with one string column named `column`."""
    def setup(tmp_path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({column: ["a document", "another"]}), tmp_path / "corpus.parquet")
    return setup


def a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")


def other_flavor_checkpoint(tmp_path: Path) -> None:
    """Weights of another model under the debug model's parameter names, as DCP saves them."""
    dcp.save({"tok_embeddings.weight": torch.randn(258, 96), "train_state": {"step": 10}},
             storage_writer=dcp.FileSystemWriter(str(tmp_path / "other")))


def one_entry_checkpoint(tmp_path: Path) -> None:
    """The debug model's embedding, alone, as DCP saves it: a checkpoint of some other model."""
    dcp.save({"tok_embeddings.weight": torch.randn(258, 128)},
             storage_writer=dcp.FileSystemWriter(str(tmp_path / "one")))


def tokenizer_files(*names: str):
    """A setup: a folder tmp_path/tokenizer with the files `names`, of random bytes."""
    def setup(tmp_path: Path) -> None:
        (tmp_path / "tokenizer").mkdir()
        for name in names:
            (tmp_path / "tokenizer" / name).write_bytes(os.urandom(64))
    return setup


LOCAL_TRAINING = ["--training.dataset", "local", "--training.dataset_path"]
VALIDATION = ["--validation.enable", "--validation.dataset", "synthetic", "--validation.steps", "1"]
LOCAL_VALIDATION = ["--validation.enable", "--validation.dataset", "local", "--validation.steps", "1",
                    "--validation.dataset_path"]

# (id, arguments, a setup of tmp_path, the key the message names, a regex of the rest of the message)
ROWS: list[tuple[str, list[str], Callable[[Path], None], str, str]] = [
    ("max-norm-negative", ["--training.max_norm", "-1"], nothing, "training.max_norm=-1.0", "ascends"),
    ("max-norm-zero", ["--training.max_norm", "0"], nothing, "training.max_norm=0.0", "must be a finite number > 0"),
    ("lr-negative", ["--optimizer.lr", "-1"], nothing, "optimizer.lr=-1.0", ">= 0"),
    ("lr-nan", ["--optimizer.lr", "nan"], nothing, "optimizer.lr=nan", ">= 0"),
    ("lr-inf", ["--optimizer.lr", "inf"], nothing, "optimizer.lr=inf", ">= 0"),
    ("weight-decay", ["--optimizer.weight_decay", "-1"], nothing, "optimizer.weight_decay=-1.0", ">= 0"),
    ("beta1", ["--optimizer.beta1", "1.5"], nothing, "optimizer.beta1=1.5", r"in \[0, 1\)"),
    ("beta2", ["--optimizer.beta2", "1"], nothing, "optimizer.beta2=1.0", r"in \[0, 1\)"),
    ("eps", ["--optimizer.eps", "0"], nothing, "optimizer.eps=0.0", "> 0"),
    ("warmup", ["--lr_scheduler.warmup_steps", "-3"], nothing, "lr_scheduler.warmup_steps=-3", ">= 0"),
    ("local-batch-zero", ["--training.local_batch_size", "0"], nothing, "training.local_batch_size=0", ">= 1"),
    ("local-batch-negative", ["--training.local_batch_size", "-2"], nothing, "training.local_batch_size=-2", ">= 1"),
    ("global-batch", ["--training.global_batch_size", "3"], nothing, "training.global_batch_size=3",
     r"not a multiple of training.local_batch_size=2 times the data-parallel degree 1"),
    ("global-batch-zero", ["--training.global_batch_size", "0"], nothing, "training.global_batch_size=0", "> 0"),
    ("checkpoint-interval", ["--checkpoint.interval", "0"], nothing, "checkpoint.interval=0", ">= 1"),
    ("log-freq", ["--metrics.log_freq", "0"], nothing, "metrics.log_freq=0", ">= 1"),
    ("switch-past-end", ["--lighthouse.switch_to_dense_at_step", "20"], nothing,
     "[lighthouse] switch_to_dense_at_step=20", "not below training.steps=20: the run would never switch"),
    ("all-layers-dense", ["--lighthouse.dense_layers", "0", "1", "2", "3"], nothing,
     "[lighthouse] dense_layers=[0, 1, 2, 3]", "no layer runs Lighthouse; set enable = false"),
    ("shard-degree", ["--parallelism.data_parallel_shard_degree", "2"], nothing, "data_parallel_shard_degree=2",
     r"does not make the 1 processes of this job \(WORLD_SIZE\)"),
    ("tp-degree", ["--parallelism.tensor_parallel_degree", "0"], nothing, "parallelism.tensor_parallel_degree=0",
     ">= 1"),
    ("validation-batch", [*VALIDATION, "--validation.local_batch_size", "0"], nothing,
     "validation.local_batch_size=0", ">= 1"),
    ("validation-seq-len", [*VALIDATION, "--validation.seq_len", "2048"], nothing, "validation.seq_len=2048",
     "longer than training.seq_len=512, the model's RoPE table"),
    ("validation-path-missing", [*LOCAL_VALIDATION, "{tmp}/none/*.jsonl"], nothing,
     "validation.dataset_path=", "matches no files"),
    ("validation-folder-empty", [*LOCAL_VALIDATION, "{tmp}"], nothing, "validation.dataset_path=",
     "is a folder with no .txt/.jsonl/.json/.parquet files"),
    ("training-path-missing", [*LOCAL_TRAINING, "{tmp}/none"], nothing, "training.dataset_path=", "matches no files"),
    ("training-path-dangling", [*LOCAL_TRAINING, "{tmp}/link.jsonl"],
     lambda tmp: (tmp / "link.jsonl").symlink_to(tmp / "gone.jsonl"), "training.dataset_path=",
     r"\(a link to nothing\) matches no files"),
    ("training-files-empty", [*LOCAL_TRAINING, "{tmp}/corpus"], empty_files, "training.dataset_path=",
     r"its 2 file\(s\) are all empty"),
    ("dataset-name", ["--training.dataset", "c5"], nothing, "training.dataset='c5'", "is not one of"),
    ("workers", ["--training.dataloader.num_workers", "2"], nothing, "training.dataloader.num_workers=2",
     "use num_workers = 0"),
    ("c4-offline", ["--training.dataset", "c4"], nothing, "training.dataset='c4'", "HF_HUB_OFFLINE=1"),
    ("dump-folder-empty", ["--job.dump_folder", ""], nothing, 'job.dump_folder=""', "names no folder"),
    ("dump-folder-file", ["--job.dump_folder", "{tmp}/file"], lambda tmp: (tmp / "file").write_text("x"),
     "job.dump_folder=", "is a file, not a folder"),
    ("checkpoint-folder-file", ["--checkpoint.folder", "ckpt"],
     lambda tmp: ((tmp / "run").mkdir(), (tmp / "run" / "ckpt").write_text("x")), "checkpoint.folder='ckpt'",
     "is a file, not a folder"),
    ("steps-below-checkpoint", ["--training.steps", "5"], checkpoint_at_step_10, "training.steps=5",
     "is below step 10 of the latest checkpoint"),
    ("changed-flavor", ["--model.flavor", "small", "--lighthouse.dense_layers"],
     previous_run(**{"model.flavor": "debug"}), "model.flavor='small'",
     "differs from 'debug' of the run that wrote the checkpoints in .*; resume with the same value"),
    ("changed-dataset", ["--training.dataset", "synthetic"], previous_run(**{"training.dataset": "local"}),
     "training.dataset='synthetic'", "differs from 'local' of the run that wrote the checkpoints"),
    ("initial-load-garbage", ["--checkpoint.initial_load_path", "{tmp}/garbage"], garbage_checkpoint,
     "checkpoint.initial_load_path=", r"has a .metadata that cannot be read \(\w+"),
    ("initial-load-two-line-error", ["--checkpoint.initial_load_path", "{tmp}/garbage"], persistent_id_checkpoint,
     "checkpoint.initial_load_path=", r"cannot be read \(UnpicklingError: .*encountered, but no persistent_load"),
    ("initial-load-other-flavor", ["--checkpoint.initial_load_path", "{tmp}/other"], other_flavor_checkpoint,
     "checkpoint.initial_load_path=", r"holds tok_embeddings.weight of shape \[258, 96\], but model.flavor='debug' "
     r"has \[258, 128\]: it is another model's checkpoint"),
    ("decay-ratio-nan", ["--lr_scheduler.decay_ratio", "nan"], nothing, "lr_scheduler.decay_ratio=nan",
     r"must be in \[0, 1\]"),
    ("decay-ratio-negative", ["--lr_scheduler.decay_ratio", "-0.5"], nothing, "lr_scheduler.decay_ratio=-0.5",
     r"must be in \[0, 1\]"),
    ("min-lr-nan", ["--lr_scheduler.min_lr_factor", "nan"], nothing, "lr_scheduler.min_lr_factor=nan",
     r"must be in \[0, 1\]"),
    ("min-lr-negative", ["--lr_scheduler.min_lr_factor", "-1"], nothing, "lr_scheduler.min_lr_factor=-1.0",
     "below 0 it ascends the gradient"),
    ("min-lr-above-1", ["--lr_scheduler.min_lr_factor", "2"], nothing, "lr_scheduler.min_lr_factor=2.0",
     "above 1 it rises during the decay"),
    ("nan-elsewhere", ["--activation_checkpoint.memory_budget", "nan"], nothing,
     "activation_checkpoint.memory_budget=nan", "is not a number"),
    ("optimizer-name", ["--optimizer.name", "Bogus"], nothing, "optimizer.name='Bogus'", r"is not one of \('Adam'"),
    ("keep-latest-1", ["--checkpoint.enable", "--checkpoint.keep_latest_k", "1"], nothing,
     "checkpoint.keep_latest_k=1", "must be 0 .* or >= 2"),
    ("expert-parallel", ["--parallelism.expert_parallel_degree", "2"], nothing,
     "parallelism.expert_parallel_degree=2", "no experts; leave it at 1"),
    ("validation-steps-zero", [*VALIDATION[:-1], "0"], nothing, "validation.steps", ">= 1"),
    ("validation-steps-negative", [*VALIDATION[:-1], "-2"], nothing, "validation.steps", ">= 1"),
    ("gc-freq-zero", ["--training.gc_freq", "0"], nothing, "training.gc_freq=0", ">= 1"),
    ("gc-freq-negative", ["--training.gc_freq", "-1"], nothing, "training.gc_freq=-1", ">= 1"),
    ("load-step-missing", ["--checkpoint.enable", "--checkpoint.load_step", "3"], checkpoint_at_step_10,
     "checkpoint.load_step=3", r"has no complete step-3; its complete checkpoints are steps \[10\]"),
    ("load-step-fresh-folder", ["--checkpoint.enable", "--checkpoint.load_step", "7"], nothing,
     "checkpoint.load_step=7", "holds no complete checkpoint to load it from"),
    ("data-parallel-degree", ["--checkpoint.enable"], written_by(2), "step-10 was written by a run with 2 "
     "data-parallel rank(s), and this one has 1", r"resume with 2 data-parallel rank\(s\)"),
    ("local-batch-absurd", ["--training.local_batch_size", "1000000000"], nothing,
     "training.local_batch_size=1000000000", "tokens per microbatch: one float32 hidden state of it"),
    ("levels-absurd", ["--lighthouse.levels", "1000000"], nothing, "levels=1000000", "is too many for any sequence"),
    ("levels-huge", ["--lighthouse.levels", str(2**70)], nothing, f"levels={2**70}", "is too many for any sequence"),
    ("steps-huge", ["--training.steps", str(2**70)], nothing, f"training.steps={2**70}", "does not fit in 64 bits"),
    ("dilation-is-seq-len", ["--lighthouse.scorer", "dilated", "--lighthouse.dilation", "512"], nothing,
     "dilation=512", "leaves one token in each strided sub-sequence of seq_len=512"),
    ("synthetic-with-path", ["--training.dataset_path", "{tmp}"], nothing, "training.dataset_path=",
     "with training.dataset='synthetic', which generates its documents and reads no file"),
    ("validation-synthetic-with-path", [*VALIDATION, "--validation.dataset_path", "nope"], nothing,
     "validation.dataset_path='nope'", "with validation.dataset='synthetic', which generates its documents"),
    ("tokenizer-folder-empty", ["--model.hf_assets_path", "{tmp}/tokenizer"], tokenizer_files(),
     "model.hf_assets_path=", "tokenizer' is an empty folder: point it at a folder with a Hugging Face tokenizer"),
    ("tokenizer-path-deprecated", ["--model.tokenizer_path", "{tmp}/none"], nothing, "model.tokenizer_path=",
     "none' does not exist"),
    ("parquet-without-text", [*LOCAL_TRAINING, "{tmp}/corpus.parquet"], parquet_with("body"),
     "training.dataset_path:", r"corpus.parquet: parquet file has no 'text' column \(columns: \['body'\]\)"),
    ("checkpoint-folder-below-a-file", ["--checkpoint.folder", "{tmp}/file/checkpoint"], a_file,
     "checkpoint.folder=", r"file/checkpoint cannot be created: .*/file is a file, not a folder"),
    ("dump-folder-below-a-file", ["--job.dump_folder", "{tmp}/file/run"], a_file, "job.dump_folder=",
     r"cannot be created: .*/file is a file, not a folder"),
    ("compile-backend", ["--compile.enable", "--compile.backend", "bogus"], nothing, "compile.backend='bogus'",
     "is not a torch.compile backend"),
    ("no-checksums", ["--resilience.no-checksums"], nothing, "[resilience] checksums=false with checkpoint.enable",
     "a resume cannot verify them and takes none; pass --checkpoint.load_unverified"),
    ("sigterm-grace", ["--resilience.sigterm_grace_s", "-1"], nothing, "[resilience] sigterm_grace_s=-1.0", ">= 0"),
    ("total-steps-negative", ["--lr_scheduler.total_steps", "-5"], nothing, "lr_scheduler.total_steps=-5",
     "is below training.steps=20: the schedule would end before the run"),
    ("total-steps-zero", ["--lr_scheduler.total_steps", "0"], nothing, "lr_scheduler.total_steps=0",
     "is below training.steps=20"),
    ("total-steps-below-steps", ["--training.steps", "2", "--lr_scheduler.total_steps", "1"], nothing,
     "lr_scheduler.total_steps=1", "is below training.steps=2"),
    ("seed-overflow", ["--debug.seed", "1180591620717411303424"], nothing, "debug.seed=1180591620717411303424",
     r"does not fit in 64 bits: torch takes seeds in \[-2\*\*63, 2\*\*64\)"),
    ("seed-negative-overflow", ["--debug.seed", str(-2**63 - 1)], nothing, f"debug.seed={-2**63 - 1}",
     "does not fit in 64 bits"),
    ("workers-negative", ["--training.dataloader.num_workers", "-1"], nothing, "training.dataloader.num_workers=-1",
     r"must be >= 0"),
    ("global-batch-negative", ["--training.global_batch_size", "-5"], nothing, "training.global_batch_size=-5",
     "must be > 0, or -1 for local_batch_size times the data-parallel degree"),
    ("checkpoint-folder-empty", ["--checkpoint.folder", ""], nothing, "checkpoint.folder=''",
     "is the dump folder itself: its step folders would lie among the run records"),
    ("checkpoint-folder-dot", ["--checkpoint.folder", "."], nothing, "checkpoint.folder='.'",
     "is the dump folder itself"),
    ("changed-seq-len", ["--training.seq_len", "256"], previous_run(**{"training.seq_len": 512}),
     "training.seq_len=256", "differs from 512 of the run that wrote the checkpoints in .*; resume with the same "
     "value"),
    ("tokenizer-folder-missing", ["--model.hf_assets_path", "{tmp}/tokenizer"], nothing,
     "model.hf_assets_path=", r"tokenizer' does not exist: point it at a folder with a Hugging Face tokenizer.json, "
     r"or set it to \".\" for the byte tokenizer"),
    ("tokenizer-folder-file", ["--model.hf_assets_path", "{tmp}/tokenizer.json"],
     lambda tmp: (tmp / "tokenizer.json").write_bytes(os.urandom(64)),
     "model.hf_assets_path=", "is a file, not a folder"),
    ("tokenizer-sentencepiece-only", ["--model.hf_assets_path", "{tmp}/tokenizer"],
     tokenizer_files("tokenizer.model"), "model.hf_assets_path=",
     r"holds tokenizer.model but no tokenizer.json, the file the recipe reads: .*save_pretrained"),
    ("tokenizer-config-only", ["--model.hf_assets_path", "{tmp}/tokenizer"],
     tokenizer_files("tokenizer_config.json", "special_tokens_map.json"), "model.hf_assets_path=",
     "holds tokenizer_config.json, special_tokens_map.json but no tokenizer.json"),
    ("initial-load-checkpointing-off", ["--checkpoint.no-enable", "--checkpoint.initial_load_path", "{tmp}/run"],
     nothing, "checkpoint.initial_load_path=", "with checkpoint.enable = false: .* would start from fresh weights"),
    ("load-step-checkpointing-off", ["--checkpoint.no-enable", "--checkpoint.load_step", "2"], nothing,
     "checkpoint.load_step=2", "with checkpoint.enable = false: .* would start from step 0"),
    ("selective-ac-word", ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option",
                           "abc"], nothing, "activation_checkpoint.selective_ac_option='abc'",
     r"must be 'op' \(per operator\) or a whole number n >= 0"),
    ("selective-ac-negative", ["--activation_checkpoint.mode", "selective",
                               "--activation_checkpoint.selective_ac_option", "-2"], nothing,
     "activation_checkpoint.selective_ac_option='-2'", "must be 'op'"),
    ("memory-budget-uncompiled", ["--activation_checkpoint.mode", "memory_budget"], nothing,
     "activation_checkpoint.mode='memory_budget'", "needs the model compiled"),
    ("memory-budget-range", ["--compile.enable", "--activation_checkpoint.mode", "memory_budget",
                             "--activation_checkpoint.memory_budget", "1.5"], nothing,
     "activation_checkpoint.memory_budget=1.5", r"must be in \[0, 1\]"),
    ("dense-every-past-end", ["--lighthouse.dense_every", "100"], nothing, "[lighthouse] dense_every=100",
     r"is above the run's last Lighthouse step 20 \(training.steps=20, switch_to_dense_at_step=0\): no step would be "
     "dense"),
    ("dense-every-past-switch", ["--lighthouse.switch_to_dense_at_step", "10", "--lighthouse.dense_every", "12"],
     nothing, "[lighthouse] dense_every=12", "is above the run's last Lighthouse step 10"),
    ("rope-theta-inf", ["--rope.theta", "inf"], nothing, "[rope] theta=inf", "must be a finite number > 0"),
    ("rope-high-freq-inf", ["--rope.high_freq_factor", "inf"], nothing, "[rope] high_freq_factor=inf",
     "must be a finite number > 0"),
    ("wandb-without-key", ["--metrics.enable_wandb"], nothing, "metrics.enable_wandb=true",
     r"W&B has no API key \(no WANDB_API_KEY, no netrc entry from `wandb login`\) and WANDB_MODE='' is not offline"),
]
if not torch.cuda.is_available():
    ROWS += [
        ("backend-cudnn", ["--lighthouse.backend", "cudnn"], nothing, "[lighthouse] backend='cudnn'", "needs CUDA"),
        ("backend-efficient", ["--lighthouse.backend", "efficient"], nothing, "[lighthouse] backend='efficient'",
         "needs CUDA"),
        ("implementation-fused", ["--lighthouse.implementation", "fused"], nothing,
         "[lighthouse] implementation='fused'", "needs CUDA"),
        ("seq-len-cpu", ["--training.seq_len", "4194304"], nothing, "training.seq_len=4194304",
         "tokens per microbatch"),
    ]


@pytest.mark.parametrize("args, setup, key, message", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_a_bad_input_is_refused_at_start_up_naming_the_key_and_changing_nothing(tmp_path, monkeypatch, args,
                                                                                 setup, key, message):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the fused kernels' CPU stand-in is for tests only
    no_wandb_login(monkeypatch, tmp_path)
    setup(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as err:
        check_start_up(parse(tmp_path, *args))
    text = str(err.value)
    assert key in text and "\n" not in text
    assert re.search(message, text), text
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("path", [".", "", None, "{tmp}"], ids=["dot", "empty", "unset", "folder-without-tokenizer"])
def test_dot_empty_unset_or_a_folder_without_tokenizer_files_is_the_byte_tokenizer(tmp_path, monkeypatch, path):
    monkeypatch.setenv("WORLD_SIZE", "1")
    (tmp_path / "config.json").write_text("{}")  # a folder of Hugging Face files, none of them a tokenizer's
    config = parse(tmp_path, *([] if path is None else ["--model.hf_assets_path", path]))
    if path is None:
        config.model.hf_assets_path = Model().hf_assets_path  # configs/debug.toml sets "."
    assert isinstance(check_start_up(config), ByteTokenizer)


def no_wandb_login(monkeypatch, tmp_path: Path) -> None:
    """An environment where W&B has no API key and is not offline (the netrc named lies outside tmp_path)."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path.parent / f"{tmp_path.name}.netrc"))


@pytest.mark.parametrize("env, netrc_host", [
    ({"WANDB_API_KEY": "k" * 40}, None), ({"WANDB_MODE": "offline"}, None), ({"WANDB_MODE": "disabled"}, None),
    ({}, "api.wandb.ai"), ({"WANDB_BASE_URL": "https://wandb.example.org"}, "wandb.example.org"),
], ids=["api-key", "offline", "disabled", "netrc", "netrc-own-server"])
def test_wandb_starts_with_an_api_key_a_netrc_login_or_offline(tmp_path, monkeypatch, env, netrc_host):
    monkeypatch.setenv("WORLD_SIZE", "1")
    no_wandb_login(monkeypatch, tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if netrc_host is not None:
        netrc_file = Path(os.environ["NETRC"])
        netrc_file.write_text(f"machine {netrc_host}\n  login user\n  password {'p' * 40}\n")
        netrc_file.chmod(0o600)
    check_start_up(parse(tmp_path, "--metrics.enable_wandb"))
    if netrc_host is not None:  # a login for another host does not count
        netrc_file.write_text(f"machine elsewhere.example.org\n  login user\n  password {'p' * 40}\n")
        with pytest.raises(ConfigError, match="W&B has no API key"):
            check_start_up(parse(tmp_path, "--metrics.enable_wandb"))


def test_a_tensorboard_folder_that_cannot_be_created_is_named_in_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    config = parse(tmp_path, "--metrics.enable_tensorboard", "--metrics.save_tb_folder", "{tmp}/file/tb")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ConfigError, match=rf"^metrics.save_tb_folder='{tmp_path}/file/tb': {tmp_path}/file/tb "
                                              r"cannot be created \(Not a directory\)$"):
            LighthouseMetricsProcessor(config, ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1,
                                                            etp=1, world_size=1))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("env, message", [
    ({"RANK": "1", "WORLD_SIZE": "1"}, r"^RANK=1 and WORLD_SIZE=1 in the environment: RANK must be in "
                                       r"\[0, WORLD_SIZE\)"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, r"^WORLD_SIZE=2 in the environment, but the job was not started by torchrun .*"
                                       r"start it with torchrun --nproc_per_node=2, or unset RANK and WORLD_SIZE$"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, r"^RANK=x and WORLD_SIZE=2 in the environment"),
])
def test_a_rank_environment_without_torchrun_is_refused_instead_of_waiting_forever(tmp_path, env, message):
    with pytest.raises(ValueError, match=message):
        check_launch(parse(tmp_path), env)
    check_launch(parse(tmp_path), {**env, "RANK": "0", "TORCHELASTIC_RUN_ID": "1"})  # torchrun's: fine
    check_launch(parse(tmp_path, "--comm.mode", "fake_backend"), {"RANK": "0", "WORLD_SIZE": "8"})  # a dry run


def one_byte_corpus(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("x")


def two_file_corpus(tmp_path: Path) -> None:
    """Two files of fresh text, each longer than the debug config's windows."""
    (tmp_path / "corpus").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "corpus" / name).write_text(os.urandom(4096).hex())


@pytest.mark.parametrize("args, setup, warning", [
    (["--optimizer.lr", "1e-300"], nothing, "optimizer.lr=1e-300 is so small that no float32 weight moves"),
    (["--optimizer.lr", "0"], nothing, "optimizer.lr=0 freezes the weights: every step computes the loss and leaves"),
    (["--training.max_norm", "1e-30"], nothing, "training.max_norm=1e-30 clips every gradient to almost nothing"),
    (["--optimizer.eps", "1e308"], nothing, "optimizer.eps=1e+308 dwarfs every gradient's second moment"),
    ([*LOCAL_TRAINING, "{tmp}/corpus"], one_byte_corpus, "training.dataset_path: its 1 file(s) hold 1 bytes in all, "
     "fewer than the 512 tokens of one window (training.seq_len): every window repeats the same text"),
    ([*LOCAL_VALIDATION, "{tmp}/corpus", "--validation.local_batch_size", "3"], one_byte_corpus,
     "validation.dataset_path: its 1 file(s) hold 1 bytes in all, fewer than the 1,536 tokens of the held-out "
     "windows (validation.steps=1 x local_batch_size=3 x seq_len=512 x 1 data-parallel rank(s)): the held-out loss "
     "scores the same text again and again"),
    ([*LOCAL_TRAINING, "{tmp}/corpus", *LOCAL_VALIDATION, "{tmp}/corpus/b.txt"], two_file_corpus,
     "validation.dataset_path and training.dataset_path share 1 file(s) ("),
], ids=["lr-tiny", "lr-0", "max-norm-tiny", "eps-huge", "one-byte-corpus", "heldout-shorter-than-its-windows",
        "heldout-is-training-text"])
def test_accepted_nonsense_runs_with_one_warning_line(tmp_path, monkeypatch, caplog, args, setup, warning):
    monkeypatch.setenv("WORLD_SIZE", "1")
    setup(tmp_path)
    with caplog.at_level(logging.WARNING):
        check_start_up(parse(tmp_path, *args))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line.startswith(warning) and "\n" not in line
    caplog.clear()
    check_start_up(parse(tmp_path))  # the debug config itself: no warning
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_corpus_whose_every_document_is_empty_stops_after_one_pass_naming_it(tmp_path):
    """Files with bytes but no text (`{"text": ""}` lines) pass the start-up checks; the first pass over them finds
    that every window would hold BOS and EOS alone."""
    (tmp_path / "a.jsonl").write_text('{"text": ""}\n' * 3)
    (tmp_path / "b.txt").write_text("")
    with pytest.raises(DataError, match=r"^2 files hold no readable document with text for data-parallel rank 0 of "
                                        r"1 \(the windows would hold BOS and EOS alone\)"):
        list(LocalFiles([str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")], rank=0, world=1))


@pytest.mark.parametrize("contents, hint", [
    (None, "(no config file was given: pass --job.config_file, e.g. configs/debug.toml)"),
    ("", "(empty.toml is empty: it sets nothing, so every key keeps torchtitan's default)"),
    ("# nothing set yet\n", "(empty.toml is empty: it sets nothing, so every key keeps torchtitan's default)"),
], ids=["none", "empty", "comments-only"])
def test_a_job_without_settings_says_no_config_was_given_or_that_it_is_empty(tmp_path, monkeypatch, contents, hint):
    monkeypatch.chdir(tmp_path)
    args = ["--job.dump_folder", str(tmp_path / "run")]
    if contents is not None:
        Path("empty.toml").write_text(contents)
        args += ["--job.config_file", "empty.toml"]
    with pytest.raises(ConfigError) as err:
        check_start_up(parse_job_config(args))
    assert str(err.value) == f"model.name='llama3' has no Lighthouse layers; use 'llama3_lighthouse' {hint}"


def test_a_config_file_that_starts_with_a_utf8_byte_order_mark_reads_as_without_it(tmp_path):
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + Path(DEBUG).read_bytes())
    with_mark = parse_job_config(["--job.config_file", str(tmp_path / "bom.toml")])
    assert with_mark.model.name == "llama3_lighthouse"
    assert with_mark.training == parse_job_config(["--job.config_file", DEBUG]).training


def test_a_damaged_newest_step_has_no_say_in_the_start_up_checks(tmp_path, monkeypatch):
    """A step-10 of noise without a manifest is passed over by the resume, so `training.steps=6` is no mistake
    (and a step-10 with its manifest is)."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    garbage_step_10(tmp_path)
    check_start_up(parse(tmp_path, "--training.steps", "6"))
    write_manifest(str(tmp_path / "run" / "checkpoint" / "step-10"), 1)
    with pytest.raises(ConfigError, match="training.steps=6 is below step 10 of the latest checkpoint"):
        check_start_up(parse(tmp_path, "--training.steps", "6"))


def test_a_parquet_file_of_random_bytes_is_named_as_a_data_fault(tmp_path):
    path = tmp_path / "corpus.parquet"
    path.write_bytes(os.urandom(300))
    with pytest.raises(DataError, match=rf"^{path} is not a readable Parquet file \(ArrowInvalid: .*\); replace or "
                                        "remove it from training.dataset_path$"):
        LocalFiles([str(path)], rank=0, world=1).describe()
    (bad,) = read_documents(str(path))
    assert bad.where == str(path) and bad.reason.startswith("not a readable Parquet file (ArrowInvalid")
    assert DataError.exit_code == 1


def test_the_debug_config_passes_and_validation_takes_the_training_length_unless_set(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    config = parse(tmp_path, *VALIDATION)
    assert config.validation.seq_len == config.training.seq_len == 512
    check_start_up(config)
    assert parse(tmp_path, *VALIDATION, "--validation.seq_len", "256").validation.seq_len == 256
    assert not (tmp_path / "run").exists()


def test_a_resume_that_changes_the_learning_rate_warns_that_the_checkpoint_keeps_its_own(tmp_path, monkeypatch,
                                                                                         caplog):
    monkeypatch.setenv("WORLD_SIZE", "1")
    previous_run(**{"model.flavor": "debug"})(tmp_path)
    with open(tmp_path / "run" / "runs" / "20260101T000000Z" / "config.toml", "a") as record:
        record.write("[optimizer]\nlr = 0.001\n")
    check_start_up(parse(tmp_path, "--optimizer.lr", "0.001"))
    assert not [r for r in caplog.records if "optimizer.lr" in r.getMessage()]
    check_start_up(parse(tmp_path, "--optimizer.lr", "0.004"))
    (warning,) = [r.getMessage() for r in caplog.records if "optimizer.lr" in r.getMessage()]
    assert warning.startswith("optimizer.lr=0.004 differs from 0.001 of the run that wrote the checkpoint")


HOLD_LOCK = """\
import fcntl, sys
f = open(sys.argv[1], "a+")
fcntl.lockf(f, fcntl.LOCK_EX)
f.write("pid 4242 on elsewhere"); f.flush()
print("locked", flush=True)
sys.stdin.read()
"""


def hold_lock(folder: Path) -> subprocess.Popen:
    """A process that holds the dump-folder lock of `folder` until its stdin closes or it is killed."""
    folder.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder / LOCK_FILE)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    return holder


def test_a_second_job_on_a_dump_folder_is_refused_until_the_first_ends_however_it_ends(tmp_path):
    folder = tmp_path / "run"
    holder = hold_lock(folder)
    with pytest.raises(ConfigError, match=rf"^job.dump_folder='{folder}' is in use by a running job \(pid 4242 on "
                                          r"elsewhere\); wait for it to end, or pass another --job.dump_folder$"):
        DumpFolderLock(str(folder))
    holder.kill()  # SIGKILL: no clean-up, yet the kernel drops the lock (a SLURM requeue finds it free)
    holder.wait()
    lock = DumpFolderLock(str(folder))
    assert (folder / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on ")
    lock.release()
    probe = open(folder / LOCK_FILE, "a+")
    fcntl.lockf(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: a lock of this process's own succeeds
    probe.close()


def train_py(tmp_path: Path, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **single_process_env(), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), **env_vars}
    env.pop(DEBUG_ENV, None)
    return run_python(["train.py", *args], env=env, timeout=300)


@pytest.mark.parametrize("case", ["lr", "non-utf8", "locked", "no-torchrun", "tokenizer-missing"])
def test_train_py_exits_2_with_one_line_and_no_traceback(tmp_path, case):
    folder = tmp_path / "run"
    args = ["--job.config_file", DEBUG, "--job.dump_folder", str(folder)]
    holder, env = None, {}
    if case == "lr":
        args += ["--optimizer.lr", "-1"]
        expected = "error: optimizer.lr=-1.0 must be a finite number >= 0"
    elif case == "non-utf8":
        (tmp_path / "latin1.toml").write_bytes("[job]\ndescription = \"caf\xe9\"\n".encode("latin-1"))
        args[1] = str(tmp_path / "latin1.toml")
        expected = f"error: {tmp_path / 'latin1.toml'} is not UTF-8 text (byte 24), as TOML must be"
    elif case == "locked":
        holder = hold_lock(folder)
        expected = f"error: job.dump_folder='{folder}' is in use by a running job (pid 4242 on elsewhere)"
    elif case == "tokenizer-missing":
        args += ["--model.hf_assets_path", str(tmp_path / "tokenizer")]
        expected = f"error: model.hf_assets_path='{tmp_path / 'tokenizer'}' does not exist"
    else:  # set by hand, not by torchrun: without the check rank 0 waits for rank 1 forever
        env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "", "MASTER_PORT": ""}
        expected = "error: WORLD_SIZE=2 in the environment, but the job was not started by torchrun"
    before = snapshot(tmp_path)
    try:
        out = train_py(tmp_path, *args, **env)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = out.stderr.splitlines()
    assert line.startswith(expected)
    assert "Traceback" not in out.stdout + out.stderr
    assert snapshot(tmp_path) == before


def test_a_dump_folder_that_cannot_be_written_is_named_and_one_without_locks_runs_with_a_warning(tmp_path,
                                                                                                  monkeypatch, caplog):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=rf"^job.dump_folder='{tmp_path}/file/run' cannot be written \(Not a "
                                          r"directory\)$"):
        DumpFolderLock(str(tmp_path / "file" / "run"))

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    DumpFolderLock(str(tmp_path / "run")).release()
    assert any(r.getMessage() == f"job.dump_folder='{tmp_path}/run' cannot be locked (No locks available); nothing "
               "stops a second job from writing there too" for r in caplog.records)


# ---------------------------------------------------------------------------------------------------------
# the scripts

EVALUATION = ["--checkpoint", "{tmp}", "--data", "{tmp}", "--out", "{tmp}/out"]


@pytest.mark.parametrize("script, args, refusal", [
    ("heldout_loss.py", [*EVALUATION, "--batch-size", "-1"], "--batch-size: -1 must be >= 1"),  # scored: loss 0.0
    ("heldout_loss.py", [*EVALUATION, "--windows", "0"], "--windows: 0 must be >= 1"),
    ("causality_audit.py", [*EVALUATION, "--samples", "0"], "--samples: 0 must be >= 1"),
    ("causality_audit.py", [*EVALUATION, "--windows", "1"], "--windows: 1 must be >= 2"),
    ("loss_anatomy.py", ["dump", "--checkpoint", "a={tmp}", *EVALUATION[2:], "--windows", "0"],
     "--windows: 0 must be >= 1"),
    ("dependence_probe.py", ["--positions", "-3"], "--positions: -3 must be >= 1"),  # probed all but the last 3
], ids=["heldout-batch-size", "heldout-windows", "audit-samples", "audit-one-window", "anatomy-windows",
        "probe-positions"])
def test_a_script_count_below_its_least_is_refused_naming_the_flag_before_anything_loads(tmp_path, monkeypatch,
                                                                                         capsys, script, args,
                                                                                         refusal):
    argv = [arg.format(tmp=tmp_path) for arg in args]
    assert script_exit_code(script, argv, monkeypatch) == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument {refusal}")


def test_make_tokenizer_names_the_documents_it_cannot_read_and_refuses_data_with_no_other(tmp_path, monkeypatch,
                                                                                          capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"title": "no text field"}\n{"text": unquoted}\n')  # trained on 0 documents, exit code 0
    argv = ["--data", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "tok")]
    assert script_exit_code("make_tokenizer.py", argv, monkeypatch) == 2
    assert re.fullmatch(rf"error: --data='{corpus}' holds no readable document \(2 document\(s\) that cannot be "
                        rf"read, the first {corpus}:1 \(byte 0\): expected an object with a string field 'text', "
                        r"got .*\)\n", capsys.readouterr().err)
    assert not (tmp_path / "tok").exists()
    text = "one document the tokenizer can learn from"
    with corpus.open("a") as f:
        f.write(json.dumps({"text": text}) + "\n")
    monkeypatch.setattr(sys, "argv", ["scripts/make_tokenizer.py", *argv])
    runpy.run_path(str(REPO / "scripts" / "make_tokenizer.py"), run_name="__main__")
    assert capsys.readouterr().out.endswith(f"trained on 1 documents ({len(text)} bytes); left out 2 document(s) that "
                                            f"cannot be read, the first {corpus}:1 (byte 0): expected an object "
                                            "with a string field 'text', got \"{'title': 'no text field'}\"\n")


@pytest.mark.parametrize("setup, folder, refusal", [
    (garbage_checkpoint, "garbage", r"has a .metadata that cannot be read \(\w+.*\)"),
    (other_flavor_checkpoint, "other", r"holds tok_embeddings.weight of shape \[258, 96\], but the job's model has "
                                       r"\[258, 128\]: it is another model's checkpoint; .*"),
    (one_entry_checkpoint, "one", r"holds no layers.0.attention.wq.weight \(\d+ of the job's model's \d+ entries "
                                  r"missing\): it is another model's checkpoint"),
], ids=["damaged", "other-flavor", "other-model"])
def test_a_script_given_a_damaged_or_another_models_checkpoint_names_it_in_one_line(tmp_path, monkeypatch, capsys,
                                                                                     setup, folder, refusal):
    setup(tmp_path)
    argv = ["--checkpoint", str(tmp_path / folder), "--job.config_file", DEBUG, "--max-new", "1", "--no-progress"]
    assert script_exit_code("generate.py", argv, monkeypatch) == 2  # DCP's traceback, exit code 1
    assert re.fullmatch(rf"error: --checkpoint='{tmp_path / folder}' {refusal}\n", capsys.readouterr().err)


@pytest.mark.parametrize("device, refusal", [
    ("gpu", "--device='gpu': use auto, cpu, cuda or cuda:<index>"),
    ("cuda:99", "--device='cuda:99', but torch "),  # sees no CUDA device, or too few: a traceback when the model moves
])
def test_a_script_given_a_device_it_cannot_use_names_it_in_one_line(tmp_path, monkeypatch, capsys, device, refusal):
    argv = ["--checkpoint", str(tmp_path), "--job.config_file", DEBUG, "--device", device, "--no-progress"]
    assert script_exit_code("generate.py", argv, monkeypatch) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {refusal}")


def test_a_held_out_document_that_cannot_be_read_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    data = tmp_path / "heldout.jsonl"
    data.write_text('{"text": "a document"}\n{"text": unquoted}\n')  # was: AttributeError, 'BadDocument' ... 'encode'
    argv = ["--checkpoint", str(tmp_path), "--data", str(data), "--windows", "1", "--out", str(tmp_path / "out"),
            "--job.config_file", DEBUG]
    assert script_exit_code("heldout_loss.py", argv, monkeypatch) == 2
    assert capsys.readouterr().err == f"error: --data='{data}': {data}:2 (byte 32): not a JSON line (Expecting value)\n"


TIME_TO_QUALITY, REPLICATE = ["time_to_quality.py", "--out", "{tmp}/report"], ["replicate_report.py", "--steps", "80"]


@pytest.mark.parametrize("script, run, refusal", [
    (TIME_TO_QUALITY, "typo", r" is not a folder \(the RUN folder of scripts/time_to_quality.sh\)"),
    (TIME_TO_QUALITY, "empty", " holds no complete arm"),  # was exit code 1, with no flag named
    (TIME_TO_QUALITY, "unvalidated", ": .*/dense_s0: steps 1..1 are not all logged, or the last step was not "
                                     "validated"),
    (REPLICATE, "typo", r" is not a folder \(the RUN folder of scripts/replicate.sh\)"),
    (REPLICATE, "empty", r" has no .*/empty/lighthouse/metrics.jsonl: is every arm of the run finished\?"),
], ids=["time-to-quality-typo", "time-to-quality-empty", "time-to-quality-unvalidated", "replicate-typo",
        "replicate-empty"])
def test_a_study_report_names_a_run_folder_it_cannot_report_in_one_line(tmp_path, monkeypatch, capsys, script, run,
                                                                        refusal):
    (tmp_path / "empty").mkdir()
    arm = tmp_path / "unvalidated" / "dense_s0"  # a step logged, none validated
    arm.mkdir(parents=True)
    (arm / "metrics.jsonl").write_text(json.dumps({"step": 1, "time_metrics/end_to_end(s)": 1.0}) + "\n")
    argv = [arg.format(tmp=tmp_path) for arg in script[1:]] + ["--run", str(tmp_path / run)]
    assert script_exit_code(script[0], argv, monkeypatch) == 2  # tracebacks: FileNotFoundError, ValueError
    assert re.fullmatch(rf"error: --run='{tmp_path / run}'{refusal}\n", capsys.readouterr().err)


@pytest.mark.parametrize("script, args, flag", [
    ("make_corpus.py", ["--source", "{tmp}", "--out", "{tmp}/file/corpus"], "--out"),
    ("make_tokenizer.py", ["--data", "{tmp}", "--vocab-size", "300", "--out", "{tmp}/file/tok"], "--out"),
    ("heldout_loss.py", [*EVALUATION[:-1], "{tmp}/file/out"], "--out"),  # written only after every window is scored
    ("loss_anatomy.py", ["report", "--dump", "{tmp}/d", "--compare", "a,b", "--out", "{tmp}/file/r"], "--out"),
    ("run_agreement.py", ["{tmp}", "{tmp}", "--json", "{tmp}/file/cmp.json"], "--json"),
    ("train_throughput.py", ["--allow-cpu", "--json", "{tmp}/file/t.json"], "--json"),
], ids=["make-corpus", "make-tokenizer", "heldout-loss", "loss-anatomy", "run-agreement", "train-throughput"])
def test_an_output_path_under_a_file_is_refused_naming_the_flag_before_any_work(tmp_path, monkeypatch, capsys,
                                                                                script, args, flag):
    (tmp_path / "file").write_text("x")  # was: NotADirectoryError once the output was written, after the work
    argv = [arg.format(tmp=tmp_path) for arg in args]
    out = argv[argv.index(flag) + 1]
    assert script_exit_code(script, argv, monkeypatch) == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument {flag}: '{out}': {tmp_path / 'file'} "
                                                             "is a file, not a folder")


NIAH = ["niah.py", "--checkpoint", "{tmp}", "--out", "{tmp}/out"]


@pytest.mark.parametrize("script, flag, value, refusal", [
    (NIAH, "--lengths", "2048,4k", " is not comma-separated integers, e.g. 2048,4096"),  # was: exit code 1, no flag
    (NIAH, "--lengths", "", " names no value: give comma-separated integers >= 1, e.g. 2048,4096"),  # ZeroDivisionError
    (["causality_audit.py", *EVALUATION], "--lookaheads", "1,four", " is not comma-separated integers, e.g. 2048,4096"),
    (["causality_audit.py", *EVALUATION], "--lookaheads", "0,4", ": [0] must be >= 1"),  # a traceback after loading
    (["bench_attention.py"], "--ns", "8192;65536", " is not comma-separated integers, e.g. 2048,4096"),
    (["loss_anatomy.py", "dump", "--checkpoint", "a={tmp}", *EVALUATION[2:]], "--niah-lengths", "8192 131072",
     " is not comma-separated integers, e.g. 2048,4096"),
], ids=["niah-malformed", "niah-empty", "audit-malformed", "audit-zero", "bench-malformed", "anatomy-malformed"])
def test_a_bad_list_of_integers_is_a_usage_error_naming_the_flag_and_value(tmp_path, monkeypatch, capsys, script, flag,
                                                                           value, refusal):
    argv = [arg.format(tmp=tmp_path) for arg in script[1:]] + [flag, value]
    assert script_exit_code(script[0], argv, monkeypatch) == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument {flag}: {value!r}{refusal}")


def test_a_lookahead_longer_than_the_window_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    argv = [arg.format(tmp=tmp_path) for arg in EVALUATION] + ["--lookaheads", "1,1024", "--job.config_file", DEBUG]
    assert script_exit_code("causality_audit.py", argv, monkeypatch) == 2  # was: a traceback after the model loaded
    assert capsys.readouterr().err == ("error: --lookaheads=1,1024: lookahead 1024 leaves no position to sample in a "
                                       "window of 512 tokens (positions start at 32)\n")


AUDIT_RECORD = "an audit record (an object with selection, steps, results)"
SWEEP_RECORD = "an object with points, as sweep.py create writes"


@pytest.mark.parametrize("script, argv, contents, refusal", [
    ("causality_audit.py", ["--combine", "{json}", "--out", "{tmp}/c"], None,
     f"error: --combine {{json}} cannot be read (No such file or directory); expected {AUDIT_RECORD}"),
    ("causality_audit.py", ["--combine", "{json}", "--out", "{tmp}/c"], "{",
     f"error: --combine {{json}} is not JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
     f"(char 1)); expected {AUDIT_RECORD}"),
    ("causality_audit.py", ["--combine", "{json}", "--out", "{tmp}/c"], "[]",
     f"error: --combine {{json}} holds a JSON array; expected {AUDIT_RECORD}"),
    ("cp_throughput.py", ["--records", "{json}"], "{}",
     "error: --records {json} holds a JSON object; expected this script's records (a non-empty array of objects)"),
    ("max_context.py", ["--config", DEBUG, "--gpus", "1", "--start", "512", "--resolution", "256", "--max-len", "1024",
                        "--compile", "off", "--allow-cpu", "--json", "{json}", "--resume"], "[]",
     "error: --resume: --json {json} holds a JSON array; expected this script's record (an object with settings and "
     "results)"),
    ("flash_attn_check.py", ["--replot", "--out", "{tmp}"], "not json",
     "error: --replot --out {json} is not JSON (Expecting value: line 1 column 1 (char 0)); expected a record of "
     "this script (an object with bench, device, flash_attn)"),
    ("sweep.py", ["summary", "{tmp}"], "[]",
     f"sweep.py summary: the sweep record {{json}} holds a JSON array; expected {SWEEP_RECORD}"),
], ids=["audit-combine-missing", "audit-combine-not-json", "audit-combine-list", "cp-throughput-records",
        "max-context-resume", "flash-attn-replot", "sweep-summary"])
def test_a_json_input_of_another_shape_is_named_in_one_line_with_what_was_expected(tmp_path, monkeypatch, capsys,
                                                                                    script, argv, contents, refusal):
    json_file = tmp_path / ("sweep.json" if script == "sweep.py" else "flash_attn_check.json")
    if contents is not None:
        json_file.write_text(contents)  # was: a traceback (FileNotFoundError, JSONDecodeError, TypeError, KeyError)
    argv = [arg.format(tmp=tmp_path, json=json_file) for arg in argv]
    assert script_exit_code(script, argv, monkeypatch) == 2
    assert capsys.readouterr().err.splitlines()[-1] == refusal.format(json=json_file)


@pytest.mark.parametrize("args, refusal", [
    (["--ac", "full,bogus"], r"train_throughput\.py: error: --ac='full,bogus': 'bogus' is no activation checkpointing "
                             r"mode; comma-separated values of .*full.*"),  # was: torchtitan's error box, exit 1
    (["--tokenizer", "{tmp}/none"], r"train_throughput\.py: error: --tokenizer='{tmp}/none' holds no tokenizer\.json "
                                    r"\(.*\)"),  # was: a traceback when the tokenizer was built
    (["--config", "{tmp}/none.toml"], r"error: cannot read config file {tmp}/none\.toml: No such file or directory"),
], ids=["ac-mode", "tokenizer-folder", "config-file"])
def test_train_throughput_names_a_bad_mode_tokenizer_or_config_before_it_asks_for_cuda(tmp_path, monkeypatch, capsys,
                                                                                      args, refusal):
    """Without --allow-cpu on a CPU the script would stop at its CUDA check: each mistake is named before that."""
    argv = [arg.format(tmp=tmp_path) for arg in args]
    assert script_exit_code("train_throughput.py", argv, monkeypatch) == 2
    assert re.fullmatch(refusal.format(tmp=re.escape(str(tmp_path))), capsys.readouterr().err.splitlines()[-1])
