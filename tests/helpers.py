"""Shared test inputs: fresh random q, k, v of a given geometry, vectors of given norms, where kernels run,
a CPU stand-in for FlashAttention, the environment of a child process that runs the recipe, a script run in
this process to its exit, and a signal sent to a running job once it is ready."""
from __future__ import annotations

import json
import os
import random
import runpy
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def script_exit_code(script: str, argv: list[str], monkeypatch) -> int | str | None:
    """Run `scripts/<script>` in this process with `argv` and return the code of the SystemExit it must end with."""
    monkeypatch.setattr(sys, "argv", [f"scripts/{script}", *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / script), run_name="__main__")
    return exit_info.value.code


def refused_line(script: str, argv: list[str], monkeypatch, capsys) -> str:
    """The last line on stderr of `scripts/<script> ARGV` run in this process, which must exit with code 2 without a
    traceback (argparse's usage lines may come first)."""
    assert script_exit_code(script, argv, monkeypatch) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def child_env() -> dict[str, str]:
    """This process's environment for a child that runs train.py or a script: offline, the checkout importable."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def run_without_torch(script: str, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGV` from the repository root in a process where importing torch or torchtitan fails: what it
    does before its heavy imports, and only that, can succeed."""
    code = ("import runpy, sys\n"
            "class Blocked:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.partition('.')[0] in ('torch', 'torchtitan'):\n"
            "            raise ImportError(f'{name} is not to be imported')\n"
            "sys.meta_path.insert(0, Blocked())\n"
            f"sys.argv = [{script!r}, *{argv!r}]\n"
            f"runpy.run_path({script!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=timeout)


def train_in_one_process(argvs: list[list[str]], timeout: float = 300) -> subprocess.CompletedProcess:
    """train.py's jobs `argvs`, one after another in one fresh single-process interpreter from the checkout (one
    start-up and one import for all of them)."""
    from recipe.launch import single_process_env  # here: test_cpu_compat imports the recipe only inside its tests

    from tests.warm_python import run_python

    code = f"import train\nfor argv in {json.dumps(argvs)}:\n    train.main(argv)\n"
    return run_python(["-c", code], env={**child_env(), **single_process_env()}, timeout=timeout)

def torchrun(nproc: int, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=NPROC ARGS` to its end, from the checkout (torchrun and its ranks
    forked from the warm interpreter; its rendezvous binds whichever port is free, so no other job can take it
    first)."""
    from tests.warm_python import warm_torchrun

    command, env = warm_torchrun(["--standalone", f"--nproc_per_node={nproc}"], args, child_env())
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)

# The Triton kernels run on CUDA, or on the CPU in Triton's interpreter (conftest.py sets TRITON_INTERPRET=1).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# The dtypes the fused paths are compared in: bf16 on GPU only (lighthouse.testing.ERROR_RATIO says why).
KERNEL_DTYPES = (torch.float32, torch.float16) + ((torch.bfloat16,) if DEVICE.type == "cuda" else ())


def fresh_seed() -> int:
    """A new seed for a test whose inputs must be rebuilt elsewhere (another rank) or named in a failure."""
    return random.randrange(2**31)


def random_qkv(
    batch: int,
    seq_len: int,
    heads: int,
    kv_heads: int,
    dim: int,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    requires_grad: bool = False,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh standard-normal q [B,N,H,D], k, v [B,N,G,D]; with `seed`, the same tensors every call."""
    gen = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    shapes = ((batch, seq_len, heads, dim), (batch, seq_len, kv_heads, dim), (batch, seq_len, kv_heads, dim))
    return tuple(
        torch.randn(s, generator=gen, device=device, dtype=dtype).requires_grad_(requires_grad) for s in shapes
    )


def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[B, heads, S, D] views of q and of k, v repeated to q's heads (the CPU flash op has no GQA)."""
    reps = q.shape[2] // k.shape[2]
    return q.transpose(1, 2), *(x.repeat_interleave(reps, dim=2).transpose(1, 2) for x in (k, v))


def _cpu_flash_forward(q, k, v, causal):
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*_repeat_kv(q, k, v), 0.0, causal)[:2]
    return o.transpose(1, 2), lse


def _cpu_flash_backward(grad_o, q, k, v, o, lse, causal):
    heads, kv_heads = q.shape[2], k.shape[2]
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_o.transpose(1, 2), *_repeat_kv(q, k, v), o.transpose(1, 2), lse, 0.0, causal)
    dk, dv = (x.transpose(1, 2).unflatten(2, (kv_heads, heads // kv_heads)).sum(3) for x in (dk, dv))
    return dq.transpose(1, 2), dk, dv


@contextmanager
def cpu_flash_attn() -> Iterator[None]:
    """FlashAttention's ops backed by torch's CPU flash SDPA while inside, registered as FlashAttention-4 is
    (`lighthouse.flash_attn.register_flash_attn`); the previous implementation is restored on exit."""
    from lighthouse.flash_attn import FlashAttnKernels, register_flash_attn

    stand_in = FlashAttnKernels("CPU flash SDPA", _cpu_flash_forward, _cpu_flash_backward, ("cpu",))
    previous = register_flash_attn(stand_in)
    try:
        yield
    finally:
        register_flash_attn(previous)


def vectors_with_norms(norms: torch.Tensor, dim: int) -> torch.Tensor:
    """Random directions [..., dim] whose L2 norms are exactly-ish `norms` (float64)."""
    x = torch.randn(*norms.shape, dim, dtype=torch.float64)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True) * norms.unsqueeze(-1)


def sharp_random_model(job_argv: list[str]):
    """The job's model with fresh N(0, 0.2^2) weights, sharp enough that attention depends on position (so RoPE
    and the q/k layout show in the logits), and its parsed job config."""
    from eval.checkpoint import build_model, parse_job_config

    job_config = parse_job_config(job_argv)
    model = build_model(job_config, torch.device("cpu"))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    return job_config, model


def signal_when(job: subprocess.Popen, ready: Callable[[], bool], signum: int, wait_s: float = 300) -> tuple[str, str]:
    """Send `signum` to the running `job` once `ready()` (failing if the job ends or `wait_s` passes first);
    its stdout and stderr to the end. The job is killed if anything goes wrong."""
    deadline = time.monotonic() + wait_s
    try:
        while not ready():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
            time.sleep(0.05)
        job.send_signal(signum)
        return job.communicate(timeout=120)
    finally:
        job.kill()
