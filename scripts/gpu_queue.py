"""Run a list of shell commands on the GPUs of one machine: one command per GPU at a time, each after the
commands it waits for, so independent study arms run side by side (docs/studies/time_to_quality_long.md).

    python scripts/gpu_queue.py --tasks tasks.tsv --gpus 0,1,2,3 --logs outputs/queue

`tasks.tsv` holds one task a line, `name<TAB>after<TAB>command`: `after` is `-` or the comma-separated names of
tasks that must have succeeded first. A free GPU takes the first task in file order whose waits are over; the
command runs in `bash -c` with `CUDA_VISIBLE_DEVICES` set to that GPU. Each task writes `<logs>/<name>.log` and,
when it ends, `<logs>/<name>.json` (exit code, GPU, start and end time). A task that already succeeded is not run
again, so a stopped queue continues where it stopped; a failed task's dependants are skipped and the queue exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from recipe.experiments.task_queue import Task, read_tasks, succeeded


def run_queue(tasks: list[Task], gpus: list[str], logs: Path, poll_s: float = 1.0) -> dict[str, int]:
    """Run `tasks` on `gpus`; return each task's exit code (-1: skipped because a task it waits for failed)."""
    logs.mkdir(parents=True, exist_ok=True)
    codes = {t.name: 0 for t in tasks if succeeded(logs, t)}
    todo = [t for t in tasks if t.name not in codes]
    running: dict[str, tuple[Task, subprocess.Popen, float]] = {}
    while todo or running:
        for gpu, (task, process, start) in list(running.items()):
            if process.poll() is None:
                continue
            del running[gpu]
            codes[task.name] = process.returncode
            (logs / f"{task.name}.json").write_text(json.dumps(
                {"name": task.name, "gpu": gpu, "returncode": process.returncode, "command": task.command,
                 "start": start, "end": time.time()}) + "\n")
            print(f"[queue] {task.name} on GPU {gpu}: exit {process.returncode} after {time.time() - start:.0f} s",
                  flush=True)
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
                                           env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu})
            running[gpu] = (ready, process, time.time())
            print(f"[queue] {ready.name} on GPU {gpu}", flush=True)
        time.sleep(poll_s)
    return codes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=Path, required=True, help="name<TAB>after<TAB>command, one task a line")
    p.add_argument("--gpus", required=True, help="comma-separated GPU indices, one task at a time on each")
    p.add_argument("--logs", type=Path, required=True, help="folder of each task's log and exit record")
    args = p.parse_args(argv)
    try:
        tasks = read_tasks(args.tasks)
    except (OSError, ValueError) as err:
        p.error(str(err))
    codes = run_queue(tasks, [g for g in args.gpus.split(",") if g], args.logs)
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
