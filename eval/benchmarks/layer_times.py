"""Where a training step's time goes: forward and backward time of every transformer block, timed inside the
training job itself (scripts/train_layer_times.py, which `scripts/cp_throughput.py --layer-times` runs in place
of train.py), grouped as dense layers, Lighthouse layers and the rest of the step.

Hooks on each block of the parallelized model (outside its compiled graph, its checkpoint wrapper and FSDP)
mark four points per block and micro-batch: forward start and end (module forward pre- and post-hooks), and
backward start and end (gradient hooks on the block's output and input tensors). On CUDA the marks are CUDA
events on the current stream, so the times are device time between the marks; on a CPU they are wall time.
A block's backward time includes the recomputed forward under activation checkpointing. "Rest" is the step
(the trainer's whole `train_step`: embedding, output layer, loss, optimizer, gradient clipping and the
collectives between blocks) less the blocks.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from recipe.train.trainer import LighthouseTrainer

LAYER_TIMES_FILE = "layer_times.json"
KINDS = ("dense", "lighthouse")


class Mark:
    """A point in time: a recorded CUDA event on `device` of type cuda, else the wall clock."""

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        if self.event is not None:
            self.event.record()
        self.wall = time.perf_counter()

    def seconds_to(self, later: "Mark") -> float:
        """Seconds from this mark to `later` (the device synchronised before)."""
        if self.event is not None:
            return self.event.elapsed_time(later.event) / 1000.0
        return later.wall - self.wall


class BlockClock:
    """Marks the forward and backward of every block in `layers` (a ModuleDict of blocks, keyed by layer id)
    during a step; `end_step` returns their seconds, summed over the step's micro-batches."""

    def __init__(self, layers: nn.ModuleDict, device: torch.device) -> None:
        self.device = device
        self.marks: dict[tuple[str, str], list[Mark]] = {}
        self.handles = []
        for layer_id, block in layers.items():
            self.handles.append(block.register_forward_pre_hook(self._before(layer_id)))
            self.handles.append(block.register_forward_hook(self._after(layer_id)))
        self.start: Mark | None = None

    def _mark(self, layer_id: str, point: str) -> None:
        if self.start is not None:  # only inside a timed step (not validation or a checkpoint's forward)
            self.marks.setdefault((layer_id, point), []).append(Mark(self.device))

    def _before(self, layer_id: str):
        def hook(module: nn.Module, args: tuple) -> None:
            self._mark(layer_id, "forward_start")
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.requires_grad:  # its gradient is the block's backward output
                x.register_hook(lambda grad: self._mark(layer_id, "backward_end"))
        return hook

    def _after(self, layer_id: str):
        def hook(module: nn.Module, args: tuple, output) -> None:
            self._mark(layer_id, "forward_end")
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self._mark(layer_id, "backward_start"))
        return hook

    def begin_step(self) -> None:
        self.marks.clear()
        self.start = Mark(self.device)

    def end_step(self) -> dict:
        """{"step_s": seconds, "blocks": {layer id: {"forward_s", "backward_s"}}} of the step just ended."""
        end = Mark(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        blocks = {}
        for (layer_id, point), marks in self.marks.items():
            if point not in ("forward_start", "backward_start"):
                continue
            phase = point.removesuffix("_start")
            ends = self.marks.get((layer_id, f"{phase}_end"), [])
            blocks.setdefault(layer_id, {"forward_s": 0.0, "backward_s": 0.0})
            blocks[layer_id][f"{phase}_s"] = sum(a.seconds_to(b) for a, b in zip(marks, ends))
        step_s, self.start = self.start.seconds_to(end), None
        return {"step_s": step_s, "blocks": blocks}

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def layer_kinds(job_config, n_layers: int) -> dict[str, str]:
    """{layer id: "dense" or "lighthouse"} as the job runs its layers (`[lighthouse] enable`, `dense_layers`)."""
    section = job_config.lighthouse
    return {str(i): "lighthouse" if section.enable and i not in section.dense_layers else "dense"
            for i in range(n_layers)}


class LayerTimedTrainer(LighthouseTrainer):
    """LighthouseTrainer that times every block of every step (`BlockClock`) and, on the rank that logs
    metrics, writes the steps' times to `<dump_folder>/layer_times.json` when it closes."""

    def __init__(self, job_config, argv=None) -> None:
        super().__init__(job_config, argv)
        model = self.model_parts[0]
        self.clock = BlockClock(model.layers, self.device)
        self.kinds = layer_kinds(job_config, len(model.layers))
        self.times: list[dict] = []

    def train_step(self, data_iterator: Iterator) -> None:
        self.clock.begin_step()
        super().train_step(data_iterator)  # a failed step is not timed: its error (out of memory) goes on as it is
        self.times.append({"step": self.step, **self.clock.end_step()})

    def close(self) -> None:
        self.clock.remove()
        if self.metrics_processor.jsonl is not None and self.times:
            path = Path(self.job_config.job.dump_folder) / LAYER_TIMES_FILE
            path.write_text(json.dumps({"kinds": self.kinds, "steps": self.times}, indent=1) + "\n")
        super().close()


def summarize_layer_times(path: str | os.PathLike, warmup_steps: int) -> dict:
    """Mean seconds per step after the first `warmup_steps` logged: the step, the dense and the Lighthouse
    blocks' forward and backward (and their counts), the rest, and each group's share of the step."""
    record = json.loads(Path(path).read_text())
    kinds, steps = record["kinds"], record["steps"][warmup_steps:]
    if not steps:
        raise ValueError(f"{path}: no step after the first {warmup_steps} was timed")
    out: dict = {"timed_steps": [s["step"] for s in steps], "step_s": sum(s["step_s"] for s in steps) / len(steps)}
    blocks_s = 0.0
    for kind in KINDS:
        ids = [layer for layer, k in kinds.items() if k == kind]
        out[f"{kind}_layers"] = len(ids)
        for phase in ("forward", "backward"):
            total = sum(s["blocks"].get(layer, {}).get(f"{phase}_s", 0.0) for s in steps for layer in ids) / len(steps)
            out[f"{kind}_{phase}_s"] = total
            blocks_s += total
        out[f"{kind}_s"] = out[f"{kind}_forward_s"] + out[f"{kind}_backward_s"]
        out[f"{kind}_share"] = out[f"{kind}_s"] / out["step_s"]
    out["rest_s"] = out["step_s"] - blocks_s
    out["rest_share"] = out["rest_s"] / out["step_s"]
    return out
