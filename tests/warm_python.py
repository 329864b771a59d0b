"""`python ARGS` for the tests, started from an interpreter that has already imported torch and the other large
third-party packages: a job that trains for a second no longer spends about 6 s of two cores on its imports.

`run_python(args, env=..., timeout=...)` answers as `subprocess.run([python, *args], ..., capture_output=True,
text=True)` does. Behind it, a server per interpreter and environment (started on first use, `python -m
tests.warm_python`) imports `PRELOADED` and then forks a child per job that becomes `python ARGS` as a fresh
interpreter would: the job's working folder, environment, `sys.argv` and `sys.path[0]`; stdin from /dev/null, stdout
and stderr into files; the script, module or `-c` code run as `__main__`; and the interpreter's own exit (non-daemon
threads joined, atexit handlers, an uncaught exception's traceback and exit code 1, a signal's negative return
code). The project's own modules are not preloaded: the child imports them, in train.py's order, so what they read
at import comes from the job. The variables the preloaded packages read at import (torch's, Triton's, Hugging
Face's: all but `RUNTIME_VARIABLES`) are the server's: a job that sets others gets a server of its own. Tests of
start-up itself (signals during the imports, what an import loads) start plain subprocesses.
"""
from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRELOADED = ("torch", "torch._inductor.compile_fx", "torch.distributed.tensor", "torch.distributed.pipelining",
             "torch.nn.attention.flex_attention", "torch.utils.tensorboard", "datasets", "matplotlib.pyplot")
# Read when a job runs, not when torch or the other preloaded packages are imported: a job may set its own.
RUNTIME_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NGPU",
                     "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "COLUMNS", "PYTEST_CURRENT_TEST", "SLURM_",
                     "LIGHTHOUSE_")
READY = "ready"


def _runtime(name: str) -> bool:
    return any(name == key or (key.endswith("_") and name.startswith(key)) for key in RUNTIME_VARIABLES)


def _import_time_view(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if not _runtime(name)}


# --- the server (python -m tests.warm_python) -------------------------------------------------------------------

def _serve(control_in: int, control_out: int) -> dict:
    """Fork a child per request line; report its pid, then its return code. Returns the request in a child."""
    with os.fdopen(control_in, "r") as requests, os.fdopen(control_out, "w") as replies:
        print(READY, file=replies, flush=True)
        for line in requests:
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                return request
            print(pid, file=replies, flush=True)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status), file=replies, flush=True)
    sys.exit(0)


def _become(request: dict) -> None:
    """Turn this forked child into `python ARGS` and run it; the interpreter's exit ends the job."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "OMP_NUM_THREADS" in request["env"]:  # OpenMP read the server's value when torch was loaded
        import torch

        torch.set_num_threads(int(request["env"]["OMP_NUM_THREADS"]))
    for fd, (path, flags) in enumerate([(os.devnull, os.O_RDONLY), (request["stdout"], os.O_WRONLY),
                                        (request["stderr"], os.O_WRONLY)]):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    option, *rest = request["args"]
    if option == "-c":
        code, *argv = rest
        sys.argv, sys.path[0] = ["-c", *argv], ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(code, "<string>", "exec"), main.__dict__)
    elif option == "-m":
        module, *argv = rest
        sys.argv, sys.path[0] = [module, *argv], os.getcwd()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv, sys.path[0] = [option, *rest], os.path.dirname(os.path.abspath(option))
        runpy.run_path(option, run_name="__main__")


def _server_main() -> None:
    for name in PRELOADED:
        if importlib.util.find_spec(name.split(".")[0]) is not None:  # an install without it imports it never
            importlib.import_module(name)
    control_out = os.dup(sys.stdout.fileno())  # replies; the server's own fd 1 goes where its stderr goes
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    control_in = os.dup(sys.stdin.fileno())
    request = _serve(control_in, control_out)
    try:
        _become(request)
    except KeyboardInterrupt:  # as a fresh interpreter ends on it: traceback, exit, then SIGINT's default action
        traceback.print_exc()
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


# --- the client -----------------------------------------------------------------------------------------------

class WarmPython:
    """One server and the jobs it forks, one at a time."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.python = python
        self.server = subprocess.Popen([python, "-m", "tests.warm_python"], cwd=REPO, env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._pending = ""
        if self._reply(timeout=300) != READY:
            raise RuntimeError("the warm Python server did not start")

    def _reply(self, timeout: float | None) -> str | None:
        """The server's next line, or None when `timeout` s pass first."""
        while "\n" not in self._pending:
            ready, _, _ = select.select([self.server.stdout], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.server.stdout.fileno(), 4096).decode()
            if not chunk:
                raise RuntimeError(f"the warm Python server ended (exit code {self.server.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split("\n", 1)
        return line

    def run(self, args: list[str], *, cwd: Path | str, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            out.touch()
            err.touch()
            request = {"args": args, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            pid = int(self._reply(timeout=60))
            code = self._reply(timeout=timeout)
            if code is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(timeout=60)
                raise subprocess.TimeoutExpired([self.python, *args], timeout, out.read_text(), err.read_text())
            return subprocess.CompletedProcess([self.python, *args], int(code), out.read_text(), err.read_text())


_servers: dict[tuple[str, frozenset], WarmPython] = {}


def run_python(args: list[str], *, env: dict[str, str], timeout: float, cwd: Path | str = REPO,
               python: str = sys.executable) -> subprocess.CompletedProcess:
    """`subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)`,
    forked from the warm server of `python` and the variables of `env` read at import (started on first use)."""
    view = _import_time_view(env)
    key = (python, frozenset(view.items()))
    if key not in _servers:
        _servers[key] = WarmPython(python, view)
    return _servers[key].run(args, cwd=cwd, env=env, timeout=timeout)


if __name__ == "__main__":
    _server_main()
