"""`python ARGS` for the tests, started from an interpreter that has already imported torch and the other large
third-party packages: a job that trains for a second no longer spends about 8 s of a core on its imports.

`warm_env(env)` is `env` with two additions: tests/warm_site/ on PYTHONPATH, whose sitecustomize.py makes every
fresh `python [-u] SCRIPT | -m MODULE | -c CODE ...` started with it a client (`hand_over`), and where the warm
servers listen. A process started with it, and every Python process under it (torchrun's ranks, a script's
children), is then a job of the server of its interpreter and the variables it reads at import: `subprocess.run`,
`Popen` and torchrun work as they do with plain processes (`run_python`, `warm_job`, `warm_torchrun`). The
client hands its arguments, folder, environment and standard streams to the server (`python -m tests.warm_python
FOLDER`, started on first use, ended with the test process), which has imported `PRELOADED` and forks a child that
becomes `python ARGS` as a fresh interpreter would: the client's folder, environment, `sys.argv` and `sys.path[0]`,
its streams, the script, module or `-c` code run as `__main__`, and the interpreter's own exit (non-daemon threads
joined, atexit handlers, open files flushed, an uncaught exception's traceback and exit code 1). The client
forwards the signals it gets to the job and ends as the job ended, a signal's death included; a client killed
outright has its job killed.

The project's own modules are not preloaded: the job imports them, in train.py's order, so what they read at import
comes from the job. The variables the preloaded packages read at import (torch's, Triton's, Hugging Face's: all but
`RUNTIME_VARIABLES`) are the server's: `warm_env` starts a server per interpreter and such variables, and a client
that finds no server for its own (a variable set on the way, another interpreter) goes on as a plain process, as
does one that holds descriptors beyond its standard streams (a multiprocessing child). Tests of start-up itself
(signals during the imports, what an import loads) start plain subprocesses.
"""
from __future__ import annotations

import atexit
import gc
import hashlib
import importlib
import importlib.util
import io
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOOK = Path(__file__).resolve().parent / "warm_site"  # its sitecustomize.py makes a fresh interpreter a client
PRELOADED = ("torch", "torch._inductor.compile_fx", "torch.distributed.tensor", "torch.distributed.pipelining",
             "torch.nn.attention.flex_attention", "torch.utils.tensorboard", "datasets", "matplotlib.pyplot")
# Where the servers listen: set by `warm_env`, read by the client.
SOCKETS = "WARM_PYTHON_SOCKETS"
# Read when a job runs, not when torch or the other preloaded packages are imported: a job may set its own. The
# second line is what torchrun adds for each rank, what torchtitan sets in a test process that trains, what CUDA
# reads when it starts (the devices a GPU queue gives each of its runs, the allocator's settings), and the command
# path a shell leaves in `_` (a prefix: every name that starts with one).
RUNTIME_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NGPU",
                     "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "COLUMNS", "PYTEST_CURRENT_TEST", "SLURM_",
                     "LIGHTHOUSE_", SOCKETS,
                     "GROUP_", "ROLE_", "TORCHELASTIC_", "TORCH_NCCL_", "CUBLAS_WORKSPACE_CONFIG",
                     "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "_")
# The signals a client passes on to its job (SIGKILL and SIGSTOP cannot be caught: a killed client's job is killed).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
READY = "ready"


def _runtime(name: str) -> bool:
    return any(name == key or (key.endswith("_") and name.startswith(key)) for key in RUNTIME_VARIABLES)


def _socket_name(python: str, env: os._Environ | dict[str, str]) -> str:
    """The server's socket for an interpreter and the variables of `env` read at import."""
    view = sorted((name, value) for name, value in env.items() if not _runtime(name))
    return hashlib.sha256(json.dumps([python, view]).encode()).hexdigest()[:24] + ".sock"


def _read_line(conn: socket.socket, pending: bytearray) -> str:
    while b"\n" not in pending:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the other end closed")
        pending += chunk
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.decode()


# --- the server (python -m tests.warm_python FOLDER) ------------------------------------------------------------

def _serve(listener: socket.socket) -> tuple[dict, list[int]]:
    """Fork a child per client and tell the client its pid, then its exit code; kill the job of a client that goes
    away. Ends when the test process that started the server closes its stdin. Returns the request in a child."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_write)
    jobs: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([sys.stdin, listener, wake_read, *jobs.values()], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 4096):
            for pid in jobs:
                os.kill(pid, signal.SIGKILL)
            sys.exit(0)
        if wake_read in readable:
            os.read(wake_read, 4096)
        for conn in [c for c in jobs.values() if c in readable]:  # a client gone before its job ended
            pid = next(p for p, c in jobs.items() if c is conn)
            os.kill(pid, signal.SIGKILL)
        while jobs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = jobs.pop(pid)
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            conn.close()
        if listener in readable:
            conn, _ = listener.accept()
            try:
                message, fds, _, _ = socket.recv_fds(conn, 65536, 3)
                request = json.loads(_read_line(conn, bytearray(message)))
            except (OSError, ValueError):  # a client that ended before it asked
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for held in (listener, *jobs.values(), conn):
                    held.close()
                os.close(wake_read)
                os.close(wake_write)
                return request, fds
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            jobs[pid] = conn


def _become(request: dict, fds: list[int]) -> None:
    """Turn this forked child into `python ARGS` and run it to its end (`_exit` ends the process)."""
    sys.addaudithook(_note_writes)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "OMP_NUM_THREADS" in request["env"]:  # torch read the server's (none) when it was loaded: at most the cores
        import torch

        torch.set_num_threads(min(int(request["env"]["OMP_NUM_THREADS"]), torch.get_num_threads()))
    # Ctrl-C as this command's own start found it: a KeyboardInterrupt, or ignored (as the job's parent chose).
    signal.signal(signal.SIGINT, signal.default_int_handler if request["ctrl_c"] else signal.SIG_IGN)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if request["unbuffered"]:  # python -u, as torchrun starts its ranks
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=stream.encoding,
                                                   errors=stream.errors, write_through=True)
                                  for fd, stream in ((1, sys.stdout), (2, sys.stderr)))
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


def _server_main(folder: str) -> None:
    address = os.path.join(folder, _socket_name(sys.executable, os.environ))  # named before an import sets any
    for name in PRELOADED:
        if importlib.util.find_spec(name.split(".")[0]) is not None:  # an install without it imports it never
            importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    print(READY, flush=True)
    request, fds = _serve(listener)
    signum = None
    try:
        _become(request, fds)
        code = 0
    except SystemExit as end:
        code = _exit_code(end)
    except KeyboardInterrupt:  # as a fresh interpreter ends on it: traceback, exit, then SIGINT's default action
        traceback.print_exc()
        code, signum = 1, signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code, signum)


def _exit_code(end: SystemExit) -> int:
    """The exit code of an uncaught SystemExit, its message printed as the interpreter prints it."""
    if end.code is None:
        return 0
    if isinstance(end.code, int):
        return end.code
    print(end.code, file=sys.stderr)
    return 1


_opened_for_writing: list[bool] = []


def _note_writes(event: str, args: tuple) -> None:
    """An audit hook: note the job's first opening of a file for writing (what `_exit` may have to flush)."""
    if event == "open" and not _opened_for_writing:
        _, mode, flags = args
        if any(c in mode for c in "wax+") if isinstance(mode, str) else flags & (os.O_WRONLY | os.O_RDWR):
            _opened_for_writing.append(True)


def _exit(code: int, signum: int | None) -> None:
    """End the job as the interpreter ends: non-daemon threads joined, atexit handlers run, open files flushed. The
    modules are not torn down one by one (in a child of the server that copies every preloaded page, for seconds),
    so the finalizers of objects still alive do not run: the open files are the ones whose loss a job would see."""
    threading._shutdown()
    atexit._run_exitfuncs()
    # io's own classes, by type (an isinstance of the io.IOBase ABC takes seconds); a third of a second, so only
    # in a job that opened a file for writing.
    for stream in gc.get_objects() if _opened_for_writing else ():
        if issubclass(type(stream), (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if signum is not None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(code & 0xFF)


# --- the client: a fresh interpreter, from tests/warm_site/sitecustomize.py -----------------------------------

def hand_over() -> None:
    """Run this fresh interpreter's `python ARGS` as a job of the warm server for its interpreter and environment,
    and end as the job ends. Returns (the interpreter goes on as itself) where there is no such server, where
    the command line has options other than -u, and where the process holds descriptors other than its standard
    streams (a multiprocessing child reads its parent's pipes)."""
    args = _plain_arguments(sys.orig_argv[1:])
    if args is None or SOCKETS not in os.environ or _inherited_descriptors():
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.path.join(os.environ[SOCKETS], _socket_name(sys.executable, os.environ)))
    except OSError:
        conn.close()
        return
    request = {"args": args, "cwd": os.getcwd(), "env": dict(os.environ), "unbuffered": sys.stdout.write_through,
               "ctrl_c": signal.getsignal(signal.SIGINT) is not signal.SIG_IGN}
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # a signal from now on reaches the job, once it exists
    message = json.dumps(request).encode() + b"\n"
    sent = socket.send_fds(conn, [message], [0, 1, 2])
    conn.sendall(message[sent:])
    pending = bytearray()
    job = int(_read_line(conn, pending))

    def forward(signum: int, _frame) -> None:
        try:
            os.kill(job, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    code = int(_read_line(conn, pending))
    if code < 0:  # end by the same signal, so the parent sees what it would of the job itself
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def _plain_arguments(argv: list[str]) -> list[str] | None:
    """ARGS of `python [-u] ARGS` where ARGS is a script, `-m MODULE` or `-c CODE` and its arguments; else None."""
    while argv[:1] == ["-u"]:
        argv = argv[1:]
    if len(argv) >= 2 and argv[0] in ("-c", "-m") or argv[:1] and not argv[0].startswith("-"):
        return argv
    return None


def _inherited_descriptors() -> bool:
    def is_open(fd: int) -> bool:
        try:
            os.fstat(fd)
            return True
        except OSError:  # the descriptor of the listing itself, closed by now
            return False

    return any(fd > 2 and is_open(fd) for fd in map(int, os.listdir("/proc/self/fd")))


# --- the test process's side ------------------------------------------------------------------------------------

_folder: tempfile.TemporaryDirectory | None = None
_servers: dict[str, subprocess.Popen] = {}


def warm_env(env: dict[str, str], python: str = sys.executable) -> dict[str, str]:
    """`env` for a process whose Python processes (itself, torchrun's ranks, a script's children) are jobs of the
    warm server of `python` (started on first use, its imports done before it answers)."""
    global _folder
    if _folder is None:
        _folder = tempfile.TemporaryDirectory(prefix="warm-python-")
    python = os.path.abspath(shutil.which(python) or python)  # as the client will see itself in sys.executable
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    if str(HOOK) not in paths:
        env = {**env, "PYTHONPATH": os.pathsep.join([str(HOOK), *filter(None, paths)])}
    server_env = {name: value for name, value in env.items() if not _runtime(name)}
    name = _socket_name(python, server_env)
    if name not in _servers:
        server = subprocess.Popen([python, "-m", "tests.warm_python", _folder.name], cwd=REPO,
                                  env=server_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        if server.stdout.readline().strip() != READY:
            raise RuntimeError(f"the warm Python server of {python} did not start (exit code {server.wait()})")
        _servers[name] = server
    return {**env, SOCKETS: _folder.name}


def warm_job(args: list[str], env: dict[str, str], python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The command and environment of `[python, *args]` with `env`, a job of the warm server (`warm_env`)."""
    return [python, *args], warm_env(env, python)


def warm_torchrun(options: list[str], args: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment of `torchrun OPTIONS ARGS`, torchrun and each rank it starts warm jobs."""
    return warm_job(["-m", "torch.distributed.run", *options, *args], env)


def run_python(args: list[str], *, env: dict[str, str], timeout: float, cwd: Path | str = REPO,
               python: str = sys.executable) -> subprocess.CompletedProcess:
    """`subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)`, with
    stdin from /dev/null, run from the warm server of `python` and the variables of `env` read at import."""
    return subprocess.run([python, *args], cwd=cwd, env=warm_env(env, python), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__":
    _server_main(sys.argv[1])
