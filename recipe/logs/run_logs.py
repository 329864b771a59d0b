"""Read the scalars a torchtitan run logged: tensorboard event files, wandb offline runs or metrics.jsonl.

torchtitan writes both under `<dump_folder>/<save_tb_folder>/<YYYYmmdd-HHMM>/`, one folder per process
start, so a requeued or resumed run leaves several files whose steps can overlap (steps after the last
checkpoint are logged again). `latest` keeps the point written last for each step.
"""
from __future__ import annotations

import json
import statistics
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from recipe.logs.layout import METRICS_FILE, read_metrics

LOSS_TAG = "loss_metrics/global_avg_loss"
TPS_TAG = "throughput(tps)"
MFU_TAG = "mfu(%)"
MEMORY_TAG = "memory/max_reserved(GiB)"


@dataclass(frozen=True)
class Point:
    """One logged value of a tag."""

    step: int
    value: float
    wall_time: float


@dataclass
class LogFile:
    """The scalars of one process start: tag -> points in the order they were logged."""

    path: Path
    scalars: dict[str, list[Point]] = field(default_factory=dict)

    def add(self, tag: str, point: Point) -> None:
        self.scalars.setdefault(tag, []).append(point)


def read_tensorboard(path: Path) -> LogFile:
    """Scalars of one `events.out.tfevents.*` file."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    log = LogFile(path)
    for event in EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            if value.HasField("simple_value"):
                number = value.simple_value
            elif value.HasField("tensor") and not value.tensor.tensor_shape.dim:
                number = make_ndarray(value.tensor).item()
            else:
                continue
            log.add(value.tag, Point(int(event.step), float(number), float(event.wall_time)))
    return log


# A wandb run file (`run-<id>.wandb`) is a LevelDB-style log: a 7-byte file header, then 32 KiB blocks of
# records, each a 7-byte header (crc32c, length, type) and a chunk of a serialized `Record` protobuf.
_WANDB_IDENT = b":W&B"
_HEADER = struct.Struct("<IHB")
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(data: bytes) -> Iterable[bytes]:
    if data[:4] != _WANDB_IDENT:
        raise ValueError("not a wandb run file (bad header)")
    pos, pending = 7, b""
    while pos + _HEADER.size <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _HEADER.size:  # the tail of a block too small for a header is padding
            pos += room
            continue
        _, length, kind = _HEADER.unpack_from(data, pos)
        pos += _HEADER.size
        chunk = data[pos : pos + length]
        pos += length
        if len(chunk) < length or kind not in (_FULL, _FIRST, _MIDDLE, _LAST):
            return  # a run killed mid-write leaves a torn tail; what came before is intact
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        else:
            yield pending + chunk
            pending = b""


def read_wandb(path: Path) -> LogFile:
    """Scalars of one wandb offline run file (`wandb/offline-run-*/run-*.wandb`)."""
    from wandb.proto import wandb_internal_pb2

    log = LogFile(path)
    for raw in _wandb_records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        items = {(item.key or ".".join(item.nested_key)): item.value_json for item in record.history.item}
        wall_time = float(json.loads(items.get("_timestamp", "0")))
        for tag, text in items.items():
            value = json.loads(text)
            if tag.startswith("_") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            log.add(tag, Point(int(record.history.step.num), float(value), wall_time))
    return log


def read_jsonl(path: Path) -> list[LogFile]:
    """The recipe's `metrics.jsonl` (one {"step": n, tag: value, ...} per logged step, appended by every
    process start), cut into one LogFile per start where the step stops increasing. Lines carry no time,
    so a point's `wall_time` is its record's number in the file."""
    logs: list[LogFile] = []
    previous = None
    for number, record in enumerate(read_metrics(str(path), events=True)):
        step = record.pop("step")
        if previous is None or step <= previous:
            logs.append(LogFile(path))
        previous = step
        for tag, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                logs[-1].add(tag, Point(step, float(value), float(number)))
    return logs


def read_logs(root: Path) -> list[LogFile]:
    """Every log under a run's dump folder: its tensorboard event files if there are any, else its wandb
    offline runs, else the recipe's `metrics.jsonl`.

    They hold the same metrics when several loggers are on, so one kind is read, never two.
    """
    event_files = sorted(root.rglob("events.out.tfevents.*"))
    if event_files:
        return [read_tensorboard(path) for path in event_files]
    wandb_files = sorted(root.rglob("run-*.wandb"))
    if wandb_files:
        return [read_wandb(path) for path in wandb_files]
    return [log for path in sorted(root.rglob(METRICS_FILE)) for log in read_jsonl(path)]


def latest(logs: list[LogFile], tag: str) -> Point | None:
    """The point of the highest step; for a step logged more than once, the one written last."""
    points = [point for log in logs for point in log.scalars.get(tag, [])]
    if not points:
        return None
    return max(points, key=lambda point: (point.step, point.wall_time))


def steady_median(logs: list[LogFile], tag: str, skip: int = 1) -> float | None:
    """Median over every file's points after its first `skip` (which include start-up and compilation).

    Falls back to all points when no file logged more than `skip` of them.
    """
    series = [log.scalars.get(tag, []) for log in logs]
    steady = [point.value for points in series for point in points[skip:]]
    values = steady or [point.value for points in series for point in points]
    return statistics.median(values) if values else None


def peak(logs: list[LogFile], tag: str) -> float | None:
    """The largest value logged under `tag` in any file."""
    values = [point.value for log in logs for point in log.scalars.get(tag, [])]
    return max(values) if values else None
