"""Process-group environment for jobs started without torchrun (a plain `python train.py`, tests, scripts), and
children that end with the script that started them."""
from __future__ import annotations

import ctypes
import signal
import socket
import sys
from typing import Mapping

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a rendezvous of several processes on this machine
    that must be named before they start (another job may take it in between: a one-process job needs none)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_process_env() -> dict[str, str]:
    """The variables torchrun would set for a one-process job on this machine. MASTER_PORT=0: the job's own
    store binds whichever port is free when it starts, so one-process jobs started side by side never race for
    a port that was free when it was picked."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}


def one_process_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a job started without torchrun lacks of `environ`: all of `single_process_env` when RANK is unset,
    the variables it leaves out when RANK=0 and WORLD_SIZE=1 (or unset) were set by hand; nothing otherwise
    (torchrun's variables, or a RANK and WORLD_SIZE that the start-up checks refuse in one line)."""
    if "RANK" not in environ:
        return single_process_env()
    if "TORCHELASTIC_RUN_ID" in environ or environ["RANK"] != "0" or environ.get("WORLD_SIZE", "1") != "1":
        return {}
    return {key: value for key, value in single_process_env().items() if key not in environ}


def end_with_parent() -> None:
    """Run in a child before it starts (`subprocess`'s `preexec_fn`): the child gets SIGTERM when its parent ends,
    however it ends (SIGKILL included), so a killed script leaves no training job behind (torchrun passes the
    signal on to its workers). Linux only; elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
