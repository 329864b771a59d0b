"""torchtitan's metrics (console, TensorBoard, W&B) plus Lighthouse statistics and a metrics.jsonl file."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch.distributed as dist
from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor
from torchtitan.distributed import ParallelDims
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import NoColor

from recipe.compat.torchtitan import metrics_rank
from recipe.errors import ConfigError
from recipe.logs.layout import METRICS_FILE
from recipe.logs.lighthouse_stats import SelectionStats


class JsonlLogger(BaseLogger):
    """One JSON object per logged step, {"step": n, <metric>: value, ...}, appended to `path`; events such as
    a process start are records with an "event" key ({"event": "run_start", "step": first step, ...})."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.write({"step": step, **metrics})

    def close(self) -> None:
        self._file.close()


class LighthouseMetricsProcessor(MetricsProcessor):
    """Adds `lighthouse/*` statistics (collected in `selection_stats` during the step) to each logged step;
    `jsonl` is the metrics.jsonl logger on the rank that logs metrics, None elsewhere. Logs without colour
    codes when stdout is not a terminal (as `metrics.disable_color_printing` does). A TensorBoard folder that
    cannot be created is a ConfigError naming `metrics.save_tb_folder`."""

    def __init__(self, job_config, parallel_dims: ParallelDims, tag: str | None = None) -> None:
        try:
            super().__init__(job_config, parallel_dims, tag)
        except OSError as err:  # the TensorBoard folder (torchtitan logs W&B's failures itself)
            raise ConfigError(f"metrics.save_tb_folder={job_config.metrics.save_tb_folder!r}: {err.filename} cannot be "
                              f"created ({err.strerror})") from err
        if not sys.stdout.isatty():  # torchtitan logs to stdout: colour codes only clutter a log file
            self.color = NoColor()
        self.selection_stats = SelectionStats()
        self.jsonl: JsonlLogger | None = None  # set on the rank that logs metrics only
        if not dist.is_initialized() or dist.get_rank() == metrics_rank(parallel_dims, job_config):
            self.jsonl = JsonlLogger(os.path.join(job_config.job.dump_folder, METRICS_FILE))
            loggers = LoggerContainer()
            loggers.add_logger(self.logger)
            loggers.add_logger(self.jsonl)
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
