"""One live job per dump folder: a lock on `<dump_folder>/job.lock`, held from start-up to exit.

Two jobs writing one folder replace each other's checkpoints and interleave `metrics.jsonl`. The lock is a
POSIX record lock (`fcntl.lockf`), which the kernel (or the NFS server) drops when its process ends however
it ends, so a job killed by SIGKILL or requeued by SLURM leaves no stale lock: the file stays, the lock does
not. Rank 0 takes it (every job has a rank 0); the file names the holder for the refusal message.
"""
from __future__ import annotations

import datetime
import errno
import fcntl
import os
import socket
from typing import IO

from torchtitan.tools.logging import logger

from recipe.errors import ConfigError

LOCK_FILE = "job.lock"


class DumpFolderLock:
    """The lock on one dump folder; `release` (or the end of the process) gives it up."""

    def __init__(self, dump_folder: str) -> None:
        path = os.path.join(dump_folder, LOCK_FILE)
        try:
            os.makedirs(dump_folder, exist_ok=True)
            self.file: IO[str] | None = open(path, "a+", encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"job.dump_folder={dump_folder!r} cannot be written ({err.strerror})") from err
        try:
            fcntl.lockf(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):  # a file system without locks: run unguarded
                logger.warning(f"job.dump_folder={dump_folder!r} cannot be locked ({err.strerror}); nothing stops a "
                               "second job from writing there too")
                return
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.release()
            raise ConfigError(
                f"job.dump_folder={dump_folder!r} is in use by a running job ({holder}); wait for it to end, or "
                "pass another --job.dump_folder"
            ) from err
        started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.file.truncate(0)
        self.file.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n")
        self.file.flush()

    def release(self) -> None:
        """Give the lock up (closing the file drops it); a no-op the second time."""
        if self.file is not None:
            self.file.close()
            self.file = None
