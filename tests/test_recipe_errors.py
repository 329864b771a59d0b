"""What a person reads when starting a job: one-line config errors with exit code 2, `--help` with the
[lighthouse] options, GPU-only scripts that say so, and CPU runs without warnings that mean nothing there."""
import json
import logging
import os
import random
import re
import runpy
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from recipe.compat import cpu as cpu_compat
from recipe.launch import one_process_env, single_process_env
from recipe.train import cpu_size
from recipe.train.cli import DEBUG_ENV, OTHER_RANKS_WAIT_S, ConfigError, exit_on_config_error, parse_job_config

from .helpers import child_env, script_exit_code
from .warm_python import run_python, warm_torchrun

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def test_a_config_mistake_ends_in_one_line_on_stderr_and_exit_code_2(tmp_path):
    config = write(tmp_path, '[lighthouse]\nlevels = "three"\n')
    env = {**child_env(), **single_process_env()}
    env.pop(DEBUG_ENV, None)
    out = run_python(["train.py", "--job.config_file", config], env=env, timeout=120)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f'error: {config}: [lighthouse] levels = "three" is not an integer']
    assert "Traceback" not in out.stdout + out.stderr and "levels" not in out.stdout  # printed once


@pytest.mark.parametrize("text, message", [
    ('[lighthouse]\nlevels = "three"\n', r'\[lighthouse\] levels = "three" is not an integer$'),
    ("[lighthouse]\nlevls = 3\n", r"\[lighthouse\] levls is not a key of \[lighthouse\]; did you mean levels\?$"),
    ("[lighthous]\nlevels = 3\n", r"\[lighthous\] is not a section; did you mean \[lighthouse\]\?$"),
    ("[training.dataloader]\nnum_worker = 1\n", r"\[training.dataloader\] num_worker is not a key .*num_workers\?$"),
    ('[activation_checkpoint]\nmode = "ful"\n', r'mode = "ful" is not one of "selective", "full", "memory_budget"'),
    ('[lighthouse]\ndense_layers = ["0"]\n', r'dense_layers = \["0"\] is not a list of integers$'),
    ("[training]\nsteps = 1e4\n", r"\[training\] steps = 10000.0 is not an integer$"),
    ("[optimizer]\nlr = true\n", r"\[optimizer\] lr = true is not a number$"),
    ("[training]\ndataloader = 2\n", r"\[training\] dataloader must be a table, \[training.dataloader\]$"),
    ("[lighthouse]\nlevels = \n", r"is not valid TOML: Invalid value \(at line 2, column 10\)$"),
], ids=["type", "key-typo", "section-typo", "nested-key-typo", "literal", "list-item", "int-as-float", "bool-as-float",
        "value-for-table", "syntax"])
def test_toml_mistakes_name_the_file_and_key(tmp_path, text, message):
    config = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as err:
        parse_job_config(["--job.config_file", config])
    assert str(err.value).startswith(config) and "\n" not in str(err.value)


def test_a_custom_config_module_that_does_not_import_is_named(tmp_path):
    config = write(tmp_path, '[job]\ncustom_config_module = "recipe.nope"\n')
    with pytest.raises(ConfigError, match=r"^job.custom_config_module cannot be imported: No module named 'recipe"):
        parse_job_config(["--job.config_file", config])


def test_a_config_naming_the_job_config_module_before_the_split_is_told_its_new_name(tmp_path):
    config = write(tmp_path, '[job]\ncustom_config_module = "recipe.job_config"\n')
    with pytest.raises(ConfigError, match=r"No module named 'recipe.job_config' \(the recipe's module is now "
                                          r"'recipe.train.job_config'\)$"):
        parse_job_config(["--job.config_file", config])


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=f"cannot read config file {tmp_path}/none.toml: No such file or directory"):
        parse_job_config([f"--job.config_file={tmp_path}/none.toml"])


def test_exit_on_config_error_prints_one_line_or_with_the_debug_switch_keeps_the_traceback(capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_info, exit_on_config_error():
        raise ConfigError("[lighthouse] pool=3 must be a power of two >= 2")
    assert exit_info.value.code == 2
    assert capsys.readouterr() == ("", "error: [lighthouse] pool=3 must be a power of two >= 2\n")
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(ConfigError), exit_on_config_error():
        raise ConfigError("shown with its traceback")
    with pytest.raises(RuntimeError), exit_on_config_error():  # anything else is not a config mistake
        raise RuntimeError("a bug")


class EndedAtOnce(Exception):
    """Stands in for `os._exit`, which would end pytest too."""


def end_at_once(code: int) -> None:
    raise EndedAtOnce(code)


def test_under_torchrun_rank_0_speaks_for_the_job_and_other_ranks_leave_it_time_to(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setattr(os, "_exit", end_at_once)
    message = f"[lighthouse] topk={random.randrange(17, 31)} must be a positive multiple of tile_budget=16"
    for rank in ("0", "1"):
        error_file = tmp_path / f"error-{rank}.json"
        waits = []  # (seconds, whether the error file existed yet)
        monkeypatch.setattr(time, "sleep", lambda seconds: waits.append((seconds, error_file.exists())))
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
        with pytest.raises(EndedAtOnce) as exit_info, exit_on_config_error():
            raise ConfigError(message)
        assert exit_info.value.args == (2,)
        assert capsys.readouterr() == ("", f"error: {message}\n" if rank == "0" else "")
        assert json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"] == f"error: {message}"
        assert waits == ([] if rank == "0" else [(OTHER_RANKS_WAIT_S, False)])


@pytest.mark.parametrize("rank", ["0", "1", "7"])
def test_outside_torchrun_every_rank_prints_its_line(capsys, monkeypatch, rank):
    """A RANK set by hand (no torchrun to name rank 0's line for the job): each process says why it stopped."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", rank)
    message = f"RANK={rank} and WORLD_SIZE=1 in the environment: RANK must be in [0, WORLD_SIZE)"
    with pytest.raises(SystemExit) as exit_info, exit_on_config_error():
        raise ConfigError(message)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize("environ, added", [
    ({}, {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}),
    ({"RANK": "0"}, {"LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}),
    ({"RANK": "0", "WORLD_SIZE": "1"}, {"LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1"}, {"LOCAL_RANK", "MASTER_PORT"}),
    ({"RANK": "1"}, set()), ({"RANK": "1", "WORLD_SIZE": "2"}, set()), ({"RANK": "0", "WORLD_SIZE": "2"}, set()),
    ({"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "x"}, set()),
], ids=["none", "rank-0", "rank-0-of-1", "own-master", "rank-1", "rank-1-of-2", "rank-0-of-2", "torchrun"])
def test_a_one_process_job_gets_what_torchrun_would_set_and_other_ranks_are_left_to_the_checks(environ, added):
    """`RANK=0 WORLD_SIZE=1 python train.py` runs as a plain start does; a rank environment of several processes
    is left as it is, for `check_launch` to refuse in one line."""
    filled = one_process_env(environ)
    assert set(filled) == added
    if added:
        assert {**environ, **filled}["RANK"] == filled["LOCAL_RANK"] == "0"


HOLD_A_PORT = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
store = dist.distributed_c10d._get_default_store()
while not hasattr(store, "port"):
    store = store.underlying_store  # the group's prefixes over the TCPStore
print(store.port, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
dist.destroy_process_group()
"""


def test_one_process_jobs_started_side_by_side_each_get_a_port_of_their_own(tmp_path):
    """single_process_env names no port in advance: each job's store binds whichever is free as it starts, so two
    plain `python train.py` runs started together cannot both be handed one port that was free a moment ago."""
    done = tmp_path / "done"
    env = {**child_env(), **single_process_env()}
    jobs = [subprocess.Popen([sys.executable, "-c", HOLD_A_PORT, str(done)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        ports = [int(job.stdout.readline()) for job in jobs]  # both hold their store's port here
    finally:
        done.touch()
    assert [job.wait(timeout=60) for job in jobs] == [0, 0], [job.stderr.read() for job in jobs]
    assert 0 not in ports and ports[0] != ports[1]


@pytest.mark.slow
def test_torchrun_shows_a_config_mistake_once_and_names_it_in_its_summary(tmp_path):
    command, env = warm_torchrun(["--standalone", "--nproc_per_node=2"],
                                 [str(REPO / "train.py"), "--job.config_file", str(REPO / "configs" / "debug.toml"),
                                  "--lighthouse.topk", "40", "--job.dump_folder", str(tmp_path)],
                                 {**child_env(), "OMP_NUM_THREADS": "1"})
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    line = "error: [lighthouse] topk=40 must be a positive multiple of tile_budget=16"
    assert run.returncode == 1  # torchrun's own code for any failed worker
    assert run.stderr.splitlines().count(line) == 1, run.stderr
    root_cause = run.stderr.split("Root Cause")[1]  # rank 0, which ended the job; torchrun stopped rank 1
    assert "rank      : 0" in root_cause and "exitcode  : 2" in root_cause and f"traceback : {line}" in root_cause


def test_help_lists_the_lighthouse_options_without_a_config_file(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_job_config(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--lighthouse.levels INT", "--lighthouse.topk INT", "--lighthouse.switch-to-dense-at-step INT",
                   "--lighthouse.log-stats, --lighthouse.no-log-stats"):
        assert option in out
    assert "Selection budget k per level" in out


def test_a_toml_without_custom_config_module_still_reads_lighthouse(tmp_path):
    config = parse_job_config(["--job.config_file", write(tmp_path, "[lighthouse]\ntopk = 256\n")])
    assert config.lighthouse.topk == 256


GPU_ONLY_SCRIPTS = [
    ("bench_attention.py", [], ""),
    ("gpu_parity.py", ["--quick"], ""),
    ("cp_parity.py", [], "; --device cpu runs it with gloo"),  # it has a CPU mode and says so
    ("train_throughput.py", [], r"; --allow-cpu runs a smoke run of a small config \(--config configs/debug.toml\)"),
    ("cp_throughput.py", [], r"; --allow-cpu runs a smoke run of a small config with gloo \(--config "
                             r"configs/debug.toml\)"),
    ("max_context.py", [], r"; --allow-cpu runs a smoke run of a small config with gloo \(--config "
                           r"configs/debug.toml\)"),
]


@pytest.mark.parametrize("script, args, hint", GPU_ONLY_SCRIPTS)
def test_gpu_only_scripts_say_they_need_cuda(script, args, hint, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script_exit_code(script, args, monkeypatch) == 2
    out, err = capsys.readouterr()
    assert out == "" and re.fullmatch(rf"error: {script} needs an NVIDIA GPU with CUDA; torch .*\){hint}\n", err)


@pytest.mark.parametrize("script, args, hint", GPU_ONLY_SCRIPTS)
def test_under_torchrun_a_gpu_only_script_hands_its_line_to_torchruns_summary(script, args, hint, monkeypatch,
                                                                             capsys, tmp_path):
    """As train.py's lines do: rank 0 writes it to torchrun's error file (no "To enable traceback see ...")."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "_exit", end_at_once)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    for name, value in (("RANK", "0"), ("TORCHELASTIC_RUN_ID", "none"),
                        ("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", [f"scripts/{script}", *args])
    with pytest.raises(EndedAtOnce) as exit_info:
        runpy.run_path(str(REPO / "scripts" / script), run_name="__main__")
    line = capsys.readouterr().err.rstrip("\n")
    assert exit_info.value.args == (2,) and re.fullmatch(rf"error: {script} needs an NVIDIA GPU with CUDA; .*{hint}",
                                                         line)
    assert json.loads((tmp_path / "error.json").read_text())["message"]["extraInfo"]["py_callstack"] == line


@pytest.mark.parametrize("world, args, message", [
    ("2", ["--topk", "64"], "topk/tile_budget=2 tiles (topk=64, tile_budget=32) do not split evenly over the "
                            "2*context_parallel_degree=4 chunks of seq_len=2048"),
    ("1", ["--topk", "65"], "topk=65 must be a positive multiple of tile_budget=32"),
])
def test_cp_parity_names_a_layout_mistake_before_any_process_group_starts(world, args, message, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", world)
    argv = ["--device", "cpu", "--seq-len", "2048", "--tile-budget", "32", *args]
    assert script_exit_code("cp_parity.py", argv, monkeypatch) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {message}") and err.count("\n") == 1
    assert not torch.distributed.is_initialized()


EVAL_JOB = ["--job.config_file", str(REPO / "configs" / "debug.toml"), "--device", "cpu", "--out", "eval"]


@pytest.mark.parametrize("script, args, message", [
    ("heldout_loss.py", ["--checkpoint", "step-1", "--data", "missing/*.jsonl"],
     "--data='missing/*.jsonl' matches no files"),
    ("causality_audit.py", ["--checkpoint", "step-1", "--data", "missing"], "--data='missing' matches no files"),
    ("niah.py", ["--checkpoint", "step-1", "--lengths", "256,1024"],
     "--lengths=256,1024: lengths [1024] exceed training.seq_len=512, the model's RoPE table; pass "
     "--training.seq_len to extend it"),
    ("niah.py", ["--checkpoint", "step-1", "--lengths", "256"], "--checkpoint='step-1' is not a folder"),
    ("niah.py", ["--checkpoint", "step-1", "--lengths", "32,256"],
     "--lengths=32,256: NIAH lengths [32] are shorter than the needle and question (68 tokens)"),
    ("niah.py", ["--checkpoint", "step-1", "--lengths", "256", "--depths", "10,150"],
     "--depths=10,150: NIAH depths [150] must be percentages in [0, 100]"),
    ("loss_anatomy.py", ["dump", "--checkpoint", "a=.", "--data", "x/*.jsonl", "--niah-lengths", "64"],
     "--niah-lengths=64: NIAH lengths [64] are shorter than the needle and question (68 tokens)"),
    ("loss_anatomy.py", ["dump", "--checkpoint", "a=.", "--data", "x/*.jsonl", "--niah-lengths", "128,1024"],
     "--niah-lengths=128,1024: lengths [1024] exceed training.seq_len=512"),
], ids=["heldout-data", "audit-data", "niah-length", "niah-checkpoint", "niah-short", "niah-depth",
        "anatomy-niah-short", "anatomy-niah-long"])
def test_evaluation_scripts_name_the_option_at_fault_in_one_line(script, args, message, monkeypatch, capsys):
    assert script_exit_code(script, [*args, *EVAL_JOB], monkeypatch) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {message}") and err.count("\n") == 1
    assert "training.dataset_path" not in err


@pytest.mark.skipif(not cpu_compat.on_cpu_only(), reason="the filter is installed without an accelerator only")
def test_cpu_log_drops_the_gpu_peak_flops_warnings_and_explains_mfu_once():
    log_filter = next(f for f in logging.getLogger().filters if isinstance(f, cpu_compat.CpuLogFilter))
    log_filter.explained = False

    def record(message: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord("root", level, __file__, 1, message, (), None)

    lspci = record("Error running lspci: [Errno 2] No such file or directory: 'lspci', fallback to use device_name")
    assert not log_filter.filter(lspci)
    first = record("Peak flops undefined for: CPU x86_64, fallback to A100")
    again = record("Peak flops undefined for: CPU x86_64, fallback to A100")
    assert log_filter.filter(first) and (first.getMessage(), first.levelname) == (log_filter.MFU_NOTE, "INFO")
    assert not log_filter.filter(again)
    other = record("Peak FLOPS used for computing MFU: 3.120e+14", logging.INFO)
    assert log_filter.filter(other) and other.getMessage() == "Peak FLOPS used for computing MFU: 3.120e+14"


@pytest.mark.skipif(not cpu_compat.on_cpu_only(), reason="the filter is installed without an accelerator only")
@pytest.mark.skipif(not cpu_compat.on_cpu_only(), reason="the filter is installed without an accelerator only")
def test_cpu_log_drops_torchtitans_nccl_environment_notes_only():
    log_filter = next(f for f in logging.getLogger().filters if isinstance(f, cpu_compat.CpuLogFilter))
    note = logging.LogRecord("root", logging.WARNING, __file__, 1, "ENV[%s] = 1 will be overridden to 3 based on job "
                             "config", ("TORCH_NCCL_ASYNC_ERROR_HANDLING",), None)
    other = logging.LogRecord("root", logging.WARNING, __file__, 1, "ENV[%s] = 1 will be overridden", ("OTHER",), None)
    assert not log_filter.filter(note) and log_filter.filter(other)


def test_cpu_mesh_warnings_show_no_more_and_other_warnings_still_show():
    with warnings.catch_warnings(record=True) as caught:  # pytest resets the filters installed at import
        warnings.simplefilter("always")
        cpu_compat.ignore_cpu_mesh_warnings()
        for message in cpu_compat.CPU_MESH_WARNINGS:
            warnings.warn(message, UserWarning)
        warnings.warn("DTensor random operators may not have complete support on cuda device mesh", UserWarning)
    assert [str(w.message) for w in caught] == [
        "DTensor random operators may not have complete support on cuda device mesh"]


def test_float32_cpu_autocast_warns_no_more_and_other_warnings_still_show():
    with warnings.catch_warnings(record=True) as caught:  # pytest resets the filters installed at import
        cpu_compat.ignore_float32_autocast_warning()
        with torch.autocast("cpu", dtype=torch.float32):
            pass
        warnings.warn("In CPU autocast, something else", UserWarning)
    assert [str(w.message) for w in caught] == ["In CPU autocast, something else"]


def test_cp_parity_names_a_timing_it_cannot_take_instead_of_printing_nan(monkeypatch, capsys):
    from eval.benchmarks import cp_parity
    from lighthouse import LighthouseConfig

    monkeypatch.setattr(cp_parity.dist, "get_world_size", lambda: 2)
    job = cp_parity.CpParityJob(LighthouseConfig(levels=3, pool=4, topk=256, tile_budget=32), 4096, 1, 2, 2, 32,
                                "float32", "allgather", "cpu", 1, 2, 0)
    reason = "1-device Lighthouse at N=2048 (tokens per rank): the tiles do not fit"
    cp_parity.print_report(job, torch.device("cpu"), False, 0, [("o", 1e-7, 2e-7, 3e-7, 4e-7, 5e-7)],
                           {"CP Lighthouse fwd": 2.0}, [reason], 0.0)
    out = capsys.readouterr().out
    assert "nan" not in out and f"\nnot timed: {reason}\n" in out and "| CP Lighthouse fwd | 2.00 | 1,024,000 |" in out


TORCH_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.2 "
             "GiB is free.\nOf the allocated memory 130 GiB is allocated by PyTorch")


def test_an_out_of_memory_line_names_the_length_per_rank_and_the_knobs_that_can_still_move():
    from recipe.train.trainer import out_of_memory_line

    config = parse_job_config(["--job.config_file", str(REPO / "configs" / "long_context" /
                                                      "stage1_L3_p4_k2048_norm_1m_cp2.toml")])
    line = out_of_memory_line(config, 3, torch.OutOfMemoryError(TORCH_OOM))
    assert line == ("out of memory at step 3 (CUDA out of memory. Tried to allocate 2.00 GiB): training.seq_len="
                    "1,048,576 is 524,288 tokens per rank at parallelism.context_parallel_degree=2, "
                    "activation_checkpoint.mode='full', training.local_batch_size=1; raise "
                    "parallelism.context_parallel_degree (more GPUs) or lower training.seq_len")
    config.activation_checkpoint.mode, config.training.local_batch_size = "selective", 2
    assert out_of_memory_line(config, 1, torch.OutOfMemoryError("")).endswith(
        "(OutOfMemoryError): training.seq_len=1,048,576 is 524,288 tokens per rank at "
        "parallelism.context_parallel_degree=2, activation_checkpoint.mode='selective', training.local_batch_size=2; "
        "raise parallelism.context_parallel_degree (more GPUs), set activation_checkpoint.mode='full', lower "
        "training.local_batch_size or lower training.seq_len")


@pytest.mark.parametrize("message, expected", [
    ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", True),  # a raw CUDA call
    ("NCCL error in: ProcessGroupNCCL.cpp:1, unhandled cuda error, NCCL version 2.27.3\nCuda failure 'out of memory'",
     True),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
    ("[rank0]: Failed to CUDA calloc async 24 bytes", True),  # NCCL's, when a full card fails its buffers
    ("The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 1", False),
])
def test_a_failed_device_allocation_outside_torchs_allocator_also_counts_as_out_of_memory(message, expected):
    from recipe.errors import RunStopped
    from recipe.train.trainer import is_out_of_memory

    assert is_out_of_memory(RuntimeError(message)) is expected
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert not is_out_of_memory(RunStopped("stopped: out of memory twice"))  # already one line: passed through


@pytest.mark.slow
def test_out_of_memory_during_training_ends_in_one_line_and_exit_code_1(tmp_path):
    code = (
        "import recipe.compat; recipe.compat.install()\n"
        "import torch\n"
        "from recipe.train.trainer import LighthouseTrainer, main\n"
        "def out_of_memory(self, *args, **kwargs):\n"
        f"    raise torch.OutOfMemoryError({TORCH_OOM!r})\n"
        "LighthouseTrainer.forward_backward_step = out_of_memory\n"
        f"main(['--job.config_file', 'configs/debug.toml', '--job.dump_folder', {str(tmp_path)!r}])\n"
    )
    env = {**child_env(), **single_process_env()}
    env.pop(DEBUG_ENV, None)
    run = run_python(["-c", code], env=env, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.stderr.splitlines()[-1] == (
        "error: out of memory at step 1 (CUDA out of memory. Tried to allocate 2.00 GiB): training.seq_len=512 is 512 "
        "tokens per rank at parallelism.context_parallel_degree=1, activation_checkpoint.mode='none', "
        "training.local_batch_size=2; raise parallelism.context_parallel_degree (more GPUs), set "
        "activation_checkpoint.mode='full', lower training.local_batch_size or lower training.seq_len")
    assert "Traceback" not in run.stdout + run.stderr


ONE_M = "configs/long_context/stage1_L3_p4_k2048_norm_1m_cp2.toml"
PAPER = "configs/paper/stage1_L3_p2_k1536_dilated.toml"
NEEDS_A_GPU = "with the paper flavor needs a GPU (none found): a CPU trains at most 8,192 tokens per microbatch"


@pytest.mark.parametrize("args, message", [
    (["--job.config_file", ONE_M], f"{ONE_M}: training.seq_len=1048576 {NEEDS_A_GPU}"),
    (["--job.config_file", PAPER], f"{PAPER}: training.seq_len=98304 {NEEDS_A_GPU}"),
    (["--job.config_file", PAPER, "--training.seq-len=8192"], None),  # tyro's other spelling, with "="
    (["--job.config_file", "configs/debug.toml", "--model.flavor", "paper"], None),  # 2 x 512 tokens
    (["--job.config_file", "configs/debug.toml", "--training.seq_len", "4194304"],
     "configs/debug.toml: training.local_batch_size=2 x training.seq_len=4194304 = 8,388,608 tokens with the debug "
     "flavor needs a GPU (none found): a CPU trains at most 1,048,576"),
    (["--job.config_file", PAPER, "--comm.mode", "fake_backend"], None),  # a dry run trains nothing
    (["--job.config_file", PAPER, "--help"], None),
    (["--job.config_file", "missing.toml"], None),  # the full parse names it
    (["--job.config_file", PAPER, "--training.seq_len", "many"], None),  # tyro names it
], ids=["1m", "paper", "paper-short", "debug-as-paper", "debug-too-long", "dry-run", "help", "missing-file",
        "not-a-number"])
def test_a_gpu_sized_job_is_refused_on_a_cpu_from_its_toml_and_command_line_alone(args, message, monkeypatch):
    monkeypatch.setattr(cpu_size, "gpu_device_present", lambda: False)
    if message is None:
        cpu_size.check_cpu_size_at_once(args)
    else:
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
            cpu_size.check_cpu_size_at_once(args)


@pytest.mark.skipif(cpu_size.gpu_device_present(), reason="a machine with a GPU trains the paper model")
def test_train_py_refuses_a_gpu_sized_job_on_a_cpu_in_one_line_before_importing_torch():
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
            f"sys.argv = ['train.py', '--job.config_file', {ONE_M!r}]\n"
            "runpy.run_path('train.py', run_name='__main__')\n")
    env = {**child_env(), **single_process_env()}
    env.pop(DEBUG_ENV, None)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "torch imported: False\n"
    assert out.stderr.splitlines() == [f"error: {ONE_M}: training.seq_len=1048576 {NEEDS_A_GPU} of it in minutes a "
                                       "step; use configs/debug.toml on CPU, or lower them"]
