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


def read_metrics(path: str, events: bool = False) -> list[dict[str, Any]]:
    """The step records of a metrics.jsonl file, in the order they were logged; with `events`, the event
    records too (a `run_start` marks where each process start's steps begin), else they are left out."""
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [record for record in records if events or "event" not in record]
