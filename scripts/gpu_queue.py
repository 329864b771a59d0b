"""Run a list of shell commands on the GPUs of one machine: one command per GPU at a time, each after the
commands it waits for, so independent study arms run side by side (docs/studies/time_to_quality_long.md).

    python scripts/gpu_queue.py --tasks tasks.tsv --gpus 0,1,2,3 --logs outputs/queue

`tasks.tsv` holds one task a line, `name<TAB>after<TAB>command`: `after` is `-` or the comma-separated names of
tasks that must have succeeded first. A free GPU takes the first task in file order whose waits are over; the
command runs in `bash -c` with `CUDA_VISIBLE_DEVICES` set to that GPU. Each task writes `<logs>/<name>.log` and,
when it ends, `<logs>/<name>.json` (exit code, GPU, start and end time, and `queues`: the command of each queue that
ran it, `--invoked-as`, a stopped task's earlier ones first). A task that already succeeded is not run
again, so a stopped queue continues where it stopped; a failed task's dependants are skipped and the queue exits 1.

`--stop-after SECONDS` (a lease or a job of known length), or a SIGTERM or Ctrl-C to the queue, stops it: every
running task gets SIGTERM (a training run saves the step it is on where `[resilience] save_on_sigterm` says so, and
exits 143), is killed if it still runs `--grace` seconds later, and no task starts after. Each task runs in a
process group of its own, so the signal reaches all of it and only it. A stopped queue exits 1, as one with a failed
task does: rerun, it starts with the stopped tasks (a training run resumes the step it saved).
"""
from __future__ import annotations

import argparse
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from eval.options import gpu_list, output_folder
from recipe.experiments.task_queue import Task, bad_seconds, exit_record, read_tasks, succeeded, write_exit_record


class Stop:
    """When the queue stops: at its deadline, or at the first SIGTERM or SIGINT it gets (handled while it runs)."""

    def __init__(self, stop_after: float | None):
        self.deadline = None if stop_after is None else time.monotonic() + stop_after
        self.signalled: str | None = None

    def why(self) -> str | None:
        if self.signalled:
            return self.signalled
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "its time is up"
        return None

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less if a signal comes: the queue passes it on at once."""
        if select.select([self.wakeup], [], [], seconds)[0]:
            self.wakeup.recv(64)

    def __enter__(self) -> "Stop":
        def note(signum, frame):
            self.signalled = f"it got {signal.Signals(signum).name}"
        self.wakeup, self.woken = socket.socketpair()
        self.woken.setblocking(False)
        self.previous_fd = signal.set_wakeup_fd(self.woken.fileno())
        self.previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self.previous_fd)
        self.wakeup.close()
        self.woken.close()


def earlier_queues(logs: Path, task: Task) -> list[str]:
    """The queue commands of `task`'s exit record in `logs` (a run stopped or failed before: its process starts are
    in its folder), none where it has no record."""
    record = exit_record(logs, task.name)
    return [] if record is None else list(record.get("queues", []))


def run_queue(tasks: list[Task], gpus: list[str], logs: Path, poll_s: float = 1.0, stop_after: float | None = None,
              grace_s: float = 60.0, invoked_as: str = "") -> dict[str, int]:
    """Run `tasks` on `gpus`; return each task's exit code (-1: skipped because a task it waits for failed; -2: not
    started because the queue stopped). `invoked_as`: the command that started this queue, kept in each task's exit
    record."""
    logs.mkdir(parents=True, exist_ok=True)
    codes = {t.name: 0 for t in tasks if succeeded(logs, t)}
    todo = [t for t in tasks if t.name not in codes]
    running: dict[str, tuple[Task, subprocess.Popen, float, list[str]]] = {}
    stopped_at, killed = None, False
    with Stop(stop_after) as stop:
        while todo or running:
            for gpu, (task, process, start, queues) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[gpu]
                codes[task.name] = process.returncode
                write_exit_record(logs, {"name": task.name, "gpu": gpu, "returncode": process.returncode,
                                         "command": task.command, "start": start, "end": time.time(),
                                         "stopped": stopped_at is not None, "queues": queues})
                print(f"[queue] {task.name} on GPU {gpu}: exit {process.returncode} after {time.time() - start:.0f} s",
                      flush=True)
            if stopped_at is None and (why := stop.why()):
                stopped_at = time.monotonic()
                names = ", ".join(t.name for t, *_ in running.values()) or "no running task"
                print(f"[queue] stopping, {why}: SIGTERM to {names}; {len(todo)} not started", flush=True)
                for _, process, *_ in running.values():
                    _signal_group(process, signal.SIGTERM)
                codes.update({t.name: -2 for t in todo})
                todo = []
            if stopped_at is not None and not killed and time.monotonic() > stopped_at + grace_s:
                killed = True
                for task, process, *_ in running.values():
                    print(f"[queue] {task.name}: still running {grace_s:g} s after SIGTERM, killed", flush=True)
                    _signal_group(process, signal.SIGKILL)
            for task in [t for t in todo if any(codes.get(w, 0) != 0 for w in t.after)]:
                todo.remove(task)
                codes[task.name] = -1
                print(f"[queue] {task.name}: skipped, a task it waits for failed", flush=True)
            for gpu in [g for g in gpus if g not in running]:
                ready = next((t for t in todo if all(codes.get(w) == 0 for w in t.after)), None)
                if ready is None:
                    break
                todo.remove(ready)
                with open(logs / f"{ready.name}.log", "ab") as log:
                    process = subprocess.Popen(["bash", "-c", ready.command], stdout=log, stderr=subprocess.STDOUT,
                                               env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu},
                                               start_new_session=True)
                queues = list(dict.fromkeys(earlier_queues(logs, ready) + ([invoked_as] if invoked_as else [])))
                running[gpu] = (ready, process, time.time(), queues)
                print(f"[queue] {ready.name} on GPU {gpu}", flush=True)
            stop.sleep(poll_s)
    return codes


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    """`signum` to the task's process group (its own session: bash and whatever it started)."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:  # it ended since the last poll
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=Path, required=True, help="name<TAB>after<TAB>command, one task a line")
    p.add_argument("--gpus", type=gpu_list, required=True,
                   help="comma-separated GPU indices, one task at a time on each")
    p.add_argument("--logs", type=output_folder, required=True, help="folder of each task's log and exit record")
    p.add_argument("--stop-after", type=float, help="seconds after which the running tasks get SIGTERM and no task "
                                                    "starts")
    p.add_argument("--grace", type=float, default=60.0, help="seconds a task has after SIGTERM before it is killed")
    p.add_argument("--invoked-as", help="the command that started this queue (a study script's), kept in each "
                                        "task's exit record (default: this one)")
    args = p.parse_args(argv)
    if message := bad_seconds({"--stop-after": args.stop_after, "--grace": args.grace}):
        p.error(message)
    try:
        tasks = read_tasks(args.tasks)
        for task in tasks:  # the records the queue reads to skip what succeeded, checked before anything runs
            exit_record(args.logs, task.name)
    except OSError as err:
        p.error(f"--tasks {args.tasks} cannot be read ({err.strerror})")
    except UnicodeDecodeError as err:
        p.error(f"--tasks {args.tasks} is not UTF-8 text (byte {err.start})")
    except ValueError as err:  # a malformed line or exit record, named with its file
        p.error(str(err))
    if not tasks:
        p.error(f"--tasks {args.tasks} holds no task (a line a task: name<TAB>after<TAB>command)")
    invoked_as = args.invoked_as or shlex.join(["scripts/gpu_queue.py", *(sys.argv[1:] if argv is None else argv)])
    codes = run_queue(tasks, args.gpus.split(","), args.logs, stop_after=args.stop_after,
                      grace_s=args.grace, invoked_as=invoked_as)
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
