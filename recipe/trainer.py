"""torchtitan's Trainer with start-up checks, the switch to dense SDPA and Lighthouse statistics."""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Iterator

import torch
from torchtitan.config import ConfigManager, JobConfig
from torchtitan.protocols.train_spec import get_train_spec
from torchtitan.tools.logging import init_logger, logger
from torchtitan.train import Trainer

from .job_config import check_job_config
from .lighthouse_stats import attach_observers


def check_job(job_config: JobConfig) -> None:
    """All start-up checks of a job, before any device or process group is touched."""
    spec = get_train_spec(job_config.model.name)
    flavor = job_config.model.flavor
    if flavor not in spec.model_args:
        raise ValueError(f"model.flavor={flavor!r} is not one of {sorted(spec.model_args)}")
    if not hasattr(spec.model_args[flavor], "lighthouse_layers"):
        raise ValueError(f"model.name={job_config.model.name!r} has no Lighthouse layers; use 'llama3_lighthouse'")
    check_job_config(job_config, spec.model_args[flavor].n_layers)


class LighthouseTrainer(Trainer):
    """Checks the job first; runs dense SDPA after `[lighthouse] switch_to_dense_at_step`; collects statistics
    of the Lighthouse layers on every log step (not under context parallelism, where each rank holds only
    its chunks of the sequence)."""

    def __init__(self, job_config: JobConfig) -> None:
        check_job(job_config)
        super().__init__(job_config)
        self.switch_step = job_config.lighthouse.switch_to_dense_at_step
        self.lighthouse_on = bool(self.model_args.lighthouse_layers())

    def switch_to_dense(self) -> None:
        """Dense causal SDPA in every layer from now on; MFU accounting follows."""
        for part in self.model_parts:
            part.set_lighthouse_enabled(False)
        dense_args = dataclasses.replace(self.model_args, lighthouse=None)
        _, self.metrics_processor.num_flops_per_token = dense_args.get_nparams_and_flops(
            self.model_parts[0], self.job_config.training.seq_len
        )
        self.lighthouse_on = False
        logger.info(f"[lighthouse] switch_to_dense_at_step={self.switch_step}: dense SDPA from step {self.step}")

    def train_step(self, data_iterator: Iterator) -> None:
        if self.lighthouse_on and 0 < self.switch_step < self.step:
            self.switch_to_dense()
        observe = (
            self.lighthouse_on and self.job_config.lighthouse.log_stats and self.metrics_processor.should_log(self.step)
        )
        if observe:
            attach_observers(self.model_parts, self.metrics_processor.selection_stats)
        try:
            super().train_step(data_iterator)
        finally:
            if observe:
                attach_observers(self.model_parts, None)


def main(argv: list[str] | None = None) -> None:
    """Parse TOML + CLI (`--job.config_file ...`), then run like `torchtitan.train.main` with LighthouseTrainer."""
    init_logger()
    config = ConfigManager().parse_args(sys.argv[1:] if argv is None else argv)
    trainer: LighthouseTrainer | None = None
    finished = False
    try:
        trainer = LighthouseTrainer(config)
        if config.comm.mode == "local_tensor":
            logger.info("Local tensor mode: the trainer is built, training is skipped")
        elif config.checkpoint.create_seed_checkpoint:
            if int(os.environ["WORLD_SIZE"]) != 1:
                raise ValueError("create a seed checkpoint with one process (no sharding)")
            trainer.checkpointer.save(curr_step=0, last_step=True)
            logger.info("Created seed checkpoint")
        else:
            trainer.train()
        finished = True
    finally:
        if trainer is not None:
            trainer.close()
        if torch.distributed.is_initialized():
            if finished:
                # Every rank finished: tear the groups down together (a gloo rank destroying its group while
                # another still runs can abort at exit).
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()
