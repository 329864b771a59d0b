"""One table of final loss, throughput, MFU and peak memory over sweeps (`recipe.experiments.sweep`) or run dump
folders,
from whatever logs the runs wrote (`recipe.logs.run_logs`)."""
from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from recipe.experiments.sweep import MANIFEST
from recipe.logs import run_logs
from recipe.progress import progress_bar

FORMATS = ("md", "csv", "json")


def summarize_run(name: str, dump_folders: list[Path], final_step: int | None, loss_tag: str,
                  tps_tag: str) -> dict[str, Any]:
    """Final loss, per-GPU throughput of each stage (one dump folder per stage), MFU of the first stage and
    peak memory of one run, from whatever logs its folders hold."""
    stages = [run_logs.read_logs(folder) if folder.is_dir() else [] for folder in dump_folders]
    every = [log for logs in stages for log in logs]
    final = run_logs.latest(every, loss_tag)
    row: dict[str, Any] = {
        "run": name,
        "step": final.step if final else None,
        "final_loss": final.value if final else None,
        "tok_s_gpu": run_logs.steady_median(stages[0], tps_tag),
    }
    if len(stages) > 1:
        row["dense_tok_s_gpu"] = run_logs.steady_median(stages[1], tps_tag)
    row["mfu_pct"] = run_logs.steady_median(stages[0], run_logs.MFU_TAG)
    row["peak_gib"] = run_logs.peak(every, run_logs.MEMORY_TAG)
    if final is None:
        row["status"] = "no logs"
    elif final_step is not None and final.step < final_step:
        row["status"] = f"at step {final.step}/{final_step}"
    else:
        row["status"] = "done"
    return row


def is_sweep_record(value: Any) -> bool:
    """Whether `value` (a sweep.json) is what `summary_rows` reads: an object whose points are objects, each with
    its error and, when written (no error), its run, swept values, dump folders, steps of each stage and S."""
    points = value.get("points") if isinstance(value, dict) else None
    return isinstance(points, list) and all(
        isinstance(point, dict) and "error" in point and (point["error"] is not None or (
            isinstance(point.get("run"), str) and isinstance(point.get("values"), dict)
            and isinstance(point.get("dump_folders"), list) and isinstance(point.get("stage_steps"), list)
            and len(point["stage_steps"]) > 0 and "gathered_len" in point))
        for point in points)


def summary_rows(path: Path, loss_tag: str, tps_tag: str) -> list[dict[str, Any]]:
    """Rows for a sweep folder (one per written point, with its swept values and S), or for one run's dump
    folder."""
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        return [summarize_run(path.name, [path], None, loss_tag, tps_tag)]
    manifest = json.loads(manifest_path.read_text())
    rows = []
    written = [point for point in manifest["points"] if point["error"] is None]
    progress = progress_bar(len(written), f"sweep summary {path}: runs read")
    for point in written:
        folders = [Path(folder) for folder in point["dump_folders"]]
        row = summarize_run(point["run"], folders, point["stage_steps"][-1], loss_tag, tps_tag)
        swept = {key.rpartition(".")[2]: value for key, value in point["values"].items()}
        rows.append({"run": row.pop("run"), **swept, "S": point["gathered_len"], **row})
        progress.update()
    progress.close()
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4f}"
    return str(value)


def format_table(rows: list[dict[str, Any]], fmt: str) -> str:
    """The rows as a markdown table ("md"), CSV or JSON, one column per key any row has."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue().rstrip("\n")
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
    lines = [columns, ["-" * width for width in widths], *cells]
    return "\n".join("| " + " | ".join(text.ljust(width) for text, width in zip(line, widths)) + " |"
                     for line in lines)


def print_summary(paths: list[Path], fmt: str = "md", loss_tag: str = run_logs.LOSS_TAG,
                  tps_tag: str = run_logs.TPS_TAG) -> int:
    """Print the table; 1 when no run has logged a step (the table still says which runs it looked at), else
    0. Raises ValueError when a path does not exist or no run is found."""
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise ValueError(f"{', '.join(missing)} does not exist")
    rows = [row for path in paths for row in summary_rows(path, loss_tag, tps_tag)]
    if not rows:
        raise ValueError(f"no runs found in {', '.join(map(str, paths))}")
    print(format_table(rows, fmt))
    if all(row["step"] is None for row in rows):
        print(f"sweep.py summary: no run in {', '.join(map(str, paths))} has logged a step", file=sys.stderr)
        return 1
    return 0
