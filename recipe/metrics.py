"""torchtitan's metrics (console, TensorBoard, W&B) plus Lighthouse statistics and a metrics.jsonl file."""
from __future__ import annotations

import json
import os
from typing import Any

import torch.distributed as dist
from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor, _get_metrics_rank
from torchtitan.distributed import ParallelDims
from torchtitan.tools.logging import logger

from .lighthouse_stats import SelectionStats

METRICS_FILE = "metrics.jsonl"


class JsonlLogger(BaseLogger):
    """One JSON object per logged step, {"step": n, <metric>: value, ...}, appended to `path`."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, in the order they were logged."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class LighthouseMetricsProcessor(MetricsProcessor):
    """Adds `lighthouse/*` statistics (collected in `selection_stats` during the step) to each logged step."""

    def __init__(self, job_config, parallel_dims: ParallelDims, tag: str | None = None) -> None:
        super().__init__(job_config, parallel_dims, tag)
        self.selection_stats = SelectionStats()
        if not dist.is_initialized() or dist.get_rank() == _get_metrics_rank(parallel_dims, job_config):
            loggers = LoggerContainer()
            loggers.add_logger(self.logger)
            loggers.add_logger(JsonlLogger(os.path.join(job_config.job.dump_folder, METRICS_FILE)))
            self.logger = loggers

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None) -> None:
        lighthouse = self.selection_stats.summarize()
        super().log(step, global_avg_loss, global_max_loss, grad_norm, {**(extra_metrics or {}), **lighthouse})
        if lighthouse:
            logger.info("lighthouse  " + "  ".join(f"{k.removeprefix('lighthouse/')}: {v:.4g}"
                                                   for k, v in lighthouse.items()))


def build_lighthouse_metrics_processor(
    job_config, parallel_dims: ParallelDims, model_args=None, tag: str | None = None
) -> LighthouseMetricsProcessor:
    """TrainSpec hook replacing torchtitan's `build_metrics_processor`."""
    return LighthouseMetricsProcessor(job_config, parallel_dims, tag)
