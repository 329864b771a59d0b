"""The task file of `scripts/gpu_queue.py` and the records its tasks leave: read by the queue, which runs what has
not succeeded, and by `scripts/payoff_map.py pack`, which takes what has to another machine. Standard library only,
with the recipe's one-line error (ConfigError) for a file that is not what the queue writes."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from recipe.errors import ConfigError


@dataclass(frozen=True)
class Task:
    name: str
    after: tuple[str, ...]
    command: str


def read_tasks(path: Path) -> list[Task]:
    """The tasks of a `name<TAB>after<TAB>command` file; ConfigError naming the line for a malformed one."""
    tasks: list[Task] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0] or not parts[2].strip():
            raise ConfigError(f"{path}:{number}: expected name<TAB>after<TAB>command, got {line!r}")
        name, after, command = parts
        waits = () if after == "-" else tuple(after.split(","))
        known = {t.name for t in tasks}
        if name in known:
            raise ConfigError(f"{path}:{number}: task {name!r} is named twice")
        if unknown := [w for w in waits if w not in known]:
            raise ConfigError(f"{path}:{number}: task {name!r} waits for {unknown}, not named on an earlier line")
        tasks.append(Task(name, waits, command))
    return tasks


def exit_record(logs: Path, name: str) -> dict | None:
    """Task `name`'s exit record in the queue's `logs` folder (None where it has none): {name, gpu, returncode,
    command, start, end, stopped, queues}. ConfigError naming the file when it is not one the queue writes (a file
    edited or copied in by hand): one line from any command that reads it, rather than a traceback."""
    path = logs / f"{name}.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"{path}: not a queue exit record ({err}); delete it to run {name} again") from None
    if not (isinstance(record, dict) and isinstance(record.get("returncode"), int)
            and isinstance(record.get("command"), str) and isinstance(record.get("queues", []), list)):
        raise ConfigError(f"{path}: not a queue exit record (an object with an integer returncode, a command and a "
                         f"list of queues); delete it to run {name} again")
    return record


def write_exit_record(logs: Path, record: dict) -> None:
    """Write `record` as its task's exit record whole or not at all (a queue killed mid-write leaves the old one)."""
    path = logs / f"{record['name']}.json"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record) + "\n")
    partial.replace(path)


def succeeded(logs: Path, task: Task) -> bool:
    """Whether `task` ran to exit code 0, by its record in the queue's `logs` folder. A record of another command
    under the same name (a study edited since, whose per-token pass now scores other models) is not this task's."""
    ran = exit_record(logs, task.name)
    return ran is not None and ran["returncode"] == 0 and ran["command"] == task.command


def bad_seconds(flags: dict[str, float | None]) -> str | None:
    """The message for the first of the queue's time flags (`--stop-after`, `--grace`) that is not a finite number of
    seconds >= 0 (None: unset), or None if all are."""
    for flag, value in flags.items():
        if value is not None and not (math.isfinite(value) and value >= 0):
            return f"{flag} {value:g} must be a finite number of seconds >= 0"
    return None
