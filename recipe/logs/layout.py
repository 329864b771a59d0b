"""Where a job keeps its records in its dump folder, and how they are read back: names and readers that need no
torch or torchtitan, so that a tool can refuse a checkpoint in one line before its heavy imports."""
from __future__ import annotations

import json
from typing import Any

METRICS_FILE = "metrics.jsonl"
RUNS_FOLDER = "runs"  # one `runs/<start time>/` folder per process start (recipe/logs/run_record.py)
CONFIG_FILE = "config.toml"
RUN_FILE = "run.json"
RUN_START = "run_start"


def read_json_lines(path: str) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, one per non-empty line, in order; a line that is not a JSON object is a
    ValueError naming the file and line (a damaged or foreign file ended in a traceback, or in a message that
    named neither)."""
    records = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError:
                raise ValueError(f"{path}:{number}: not UTF-8 text") from None
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: a JSON {type(record).__name__}, not an object")
            records.append(record)
    return records


def read_metrics(path: str, events: bool = False) -> list[dict[str, Any]]:
    """The step records of a metrics.jsonl file, in the order they were logged; with `events`, the event
    records too (a `run_start` marks where each process start's steps begin), else they are left out. A line
    that is not an object with an integer `step` is a ValueError naming the file and line."""
    records = read_json_lines(path)
    for number, record in enumerate(records, 1):
        if not isinstance(step := record.get("step"), int) or isinstance(step, bool):
            raise ValueError(f"{path}: record {number} is at step {step!r}, not an integer step")
    return [record for record in records if events or "event" not in record]
