"""The task file of `scripts/gpu_queue.py` and the records its tasks leave: read by the queue, which runs what has
not succeeded, and by `scripts/payoff_map.py pack`, which takes what has to another machine. Standard library only."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Task:
    name: str
    after: tuple[str, ...]
    command: str


def read_tasks(path: Path) -> list[Task]:
    """The tasks of a `name<TAB>after<TAB>command` file; ValueError naming the line for a malformed one."""
    tasks: list[Task] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0] or not parts[2].strip():
            raise ValueError(f"{path}:{number}: expected name<TAB>after<TAB>command, got {line!r}")
        name, after, command = parts
        waits = () if after == "-" else tuple(after.split(","))
        known = {t.name for t in tasks}
        if name in known:
            raise ValueError(f"{path}:{number}: task {name!r} is named twice")
        if unknown := [w for w in waits if w not in known]:
            raise ValueError(f"{path}:{number}: task {name!r} waits for {unknown}, not named on an earlier line")
        tasks.append(Task(name, waits, command))
    return tasks


def succeeded(logs: Path, task: Task) -> bool:
    """Whether `task` ran to exit code 0, by its record in the queue's `logs` folder. A record of another command
    under the same name (a study edited since, whose per-token pass now scores other models) is not this task's."""
    record = logs / f"{task.name}.json"
    if not record.is_file():
        return False
    ran = json.loads(record.read_text())
    return ran["returncode"] == 0 and ran["command"] == task.command


def bad_seconds(flags: dict[str, float | None]) -> str | None:
    """The message for the first of the queue's time flags (`--stop-after`, `--grace`) that is not a finite number of
    seconds >= 0 (None: unset), or None if all are."""
    for flag, value in flags.items():
        if value is not None and not (math.isfinite(value) and value >= 0):
            return f"{flag} {value:g} must be a finite number of seconds >= 0"
    return None
