"""torchtitan's Trainer with start-up checks, a record of each run, the switch to dense SDPA and Lighthouse
statistics."""
from __future__ import annotations

import copy
import dataclasses
import logging
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torchtitan.components.checkpoint import AsyncMode
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import JobConfig
from torchtitan.protocols.train_spec import get_train_spec
from torchtitan.tools.logging import init_logger, logger
from torchtitan.train import Trainer

from lighthouse.host_threads import autograd_threads, colocated_autograd

from models.llama3_lighthouse import LighthouseLlama, LighthouseLlamaArgs

from recipe.compat.torchtitan import no_wait_for_other_ranks_alone, without_stop_records
from recipe.errors import ALLOCATION_FAILURES
from recipe.data.tokenizer import build_tokenizer, tokenizer_fingerprint
from recipe.hf.config import write_hf_files
from recipe.hf.importer import check_hf_import
from recipe.logs.lighthouse_stats import attach_observers
from recipe.logs.run_record import run_start_record, write_run_record
from recipe.progress import first_step_line, slow_step_line
from recipe.resilience.checkpoint_guard import (complete_steps, finished_weights, load_newest_intact, resume_step,
                                                save_or_stop)
from recipe.resilience.checkpoint_manifest import write_manifest
from recipe.resilience.dump_lock import DumpFolderLock
from recipe.resilience.finite_guard import (FiniteGuard, NonFiniteStep, checkpoint_due, last_good, non_finite_state,
                                            recorded_grad_norms)
from recipe.resilience.held_signals import ctrl_c_held, release_ctrl_c, take_sigterm
from recipe.resilience.preemption import SigtermFlag, Terminated, save_on_sigterm
from recipe.resilience.teardown import end_process_groups
from recipe.train.checks import (check_environment, check_resume_tokenizer, check_settings, check_size,
                                 data_parallel_degree, missing_config_hint)
from recipe.train.cli import ConfigError, RunStopped, as_config_error, exit_on_config_error, parse_job_config
from recipe.train.job_config import check_initial_load, check_job_config, resolve_initial_load
from recipe.train.loss import tokens_per_rank, uses_fused_loss, with_labels
# importing it registers the llama3_lighthouse TrainSpec
from recipe.train.train_spec import job_model_args, use_hf_shape, use_tokenizer


@as_config_error()
def check_job(job_config: JobConfig) -> None:
    """The start-up checks of a job's settings, before any device or process group is touched; a mistake
    raises ConfigError naming the values."""
    try:
        spec = get_train_spec(job_config.model.name)
    except ValueError as err:
        raise ValueError(f"model.name={job_config.model.name!r} is not a registered model ({err})") from err
    flavor = job_config.model.flavor
    if flavor not in spec.model_args:
        raise ValueError(f"model.flavor={flavor!r} is not one of {sorted(spec.model_args)}")
    if not hasattr(spec.model_args[flavor], "lighthouse_layers"):
        raise ValueError(f"model.name={job_config.model.name!r} has no Lighthouse layers; use 'llama3_lighthouse'"
                         + missing_config_hint(job_config))
    n_layers = use_hf_shape(copy.deepcopy(spec.model_args[flavor]), job_config).n_layers
    check_job_config(job_config, n_layers)
    check_settings(job_config, n_layers)


def model_shapes(args: LighthouseLlamaArgs) -> dict[str, tuple[int, ...]]:
    """The shape of each parameter of a model of `args` (built on the meta device: no memory, no device)."""
    with torch.device("meta"):
        model = LighthouseLlama(args)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def check_start_up(job_config: JobConfig) -> BaseTokenizer:
    """Every check before the trainer builds or writes anything: the settings (`check_job`), the tokenizer, the
    checkpoint or Hugging Face folder the job starts from, and the machine, data and dump folder; a mistake raises
    ConfigError naming the values. Returns the job's tokenizer."""
    check_job(job_config)
    with as_config_error():
        tokenizer = build_tokenizer(job_config)
        args = job_model_args(job_config, tokenizer)
        shapes = model_shapes(args)
        resolve_initial_load(job_config)
        check_initial_load(job_config, lambda: shapes, lambda: check_hf_import(
            job_config, args, shapes["layers.0.feed_forward.w1.weight"][0]))
        check_environment(job_config)
        check_resume_tokenizer(job_config, tokenizer_fingerprint(tokenizer))
        check_size(job_config, args.dim)
    return tokenizer


def _not_hf_index_warning(record: logging.LogRecord) -> bool:
    """Log filter: torchtitan warns when `model.hf_assets_path` has no `model.safetensors.index.json`, which only
    saving in HF format reads; the byte tokenizer needs no HF assets, so jobs that save none skip the warning."""
    return not record.getMessage().startswith("model.safetensors.index.json not found")


class _BuildingLineSpace(logging.Filter):
    """Log filter: torchtitan logs `Building <name> <flavor>with {...}`; the space before `with` is put back."""

    def __init__(self, job_config: JobConfig) -> None:
        super().__init__()
        self.joined = f"Building {job_config.model.name} {job_config.model.flavor}with "

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(self.joined):
            record.msg, record.args = message.replace("with ", " with ", 1), ()
        return True


def restart_point(job_config: JobConfig) -> str:
    """Where a restart of the job resumes: `step-N`, its newest checkpoint whose manifest lists every file at its
    size (`recipe.resilience.checkpoint_guard.resume_step`), else none if it has checkpoints, else its
    `checkpoint.initial_load_path`, else the start."""
    checkpoint = job_config.checkpoint
    if not checkpoint.enable:
        return "the start (checkpoint.enable = false)"
    folder = os.path.join(job_config.job.dump_folder, checkpoint.folder)
    step = resume_step(folder, checkpoint.load_unverified)
    if step is not None:
        return f"step-{step}"
    if complete_steps(folder):  # the resume refuses to start over by itself
        return f"none of the checkpoints in {folder} (each is damaged)"
    return checkpoint.initial_load_path or "the start (no checkpoint yet)"


class Interrupted(RunStopped):
    """Ctrl-C (SIGINT) during a job."""

    exit_code = 130
    prefix = "stopped"


class OutOfMemory(RunStopped):
    """The device ran out of memory during training (exit code 1)."""


def is_out_of_memory(err: BaseException) -> bool:
    """torch's OutOfMemoryError, or a RuntimeError that says a device allocation failed where torch's caching
    allocator does not see it (NCCL buffers, cuBLAS/cuDNN workspaces, `CUDA error: out of memory`)."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and not isinstance(err, RunStopped)
        and any(text in str(err) for text in ALLOCATION_FAILURES))


def out_of_memory_line(job_config: JobConfig, step: int, err: BaseException) -> str:
    """One line for an out-of-memory error at `step`: the first two sentences of torch's message, the length per
    rank and the knobs that set memory (context parallel degree, activation checkpointing, batch), with those
    that can still move.

    Whether a length fits cannot be known before the first step (the peak depends on compile, the allocator,
    the dense layers and the card; docs/context_parallel.md), so the job says it when it happens."""
    training, cp = job_config.training, job_config.parallelism.context_parallel_degree
    mode, batch = job_config.activation_checkpoint.mode, training.local_batch_size
    cause = ". ".join(str(err).split(". ")[:2]).splitlines()[0] if str(err) else type(err).__name__
    moves = ["raise parallelism.context_parallel_degree (more GPUs)"]
    moves += [] if mode == "full" else ["set activation_checkpoint.mode='full'"]
    moves += ["lower training.local_batch_size"] if batch > 1 else []
    moves += ["lower training.seq_len"]
    return (f"out of memory at step {step} ({cause.rstrip('.')}): training.seq_len={training.seq_len:,} is "
            f"{training.seq_len // cp:,} tokens per rank at parallelism.context_parallel_degree={cp}, "
            f"activation_checkpoint.mode={mode!r}, training.local_batch_size={batch}; "
            + ", ".join(moves[:-1]) + f" or {moves[-1]}")


class LighthouseTrainer(Trainer):
    """Checks the job and the checkpoint it starts from first, then locks the dump folder (rank 0; released by
    `close` or the end of the process); records the run at its first step (`argv`: the job's arguments, default
    this process's), or says that there is nothing left to train; stops a run whose loss or gradient norm, or
    whose parameters, optimizer state or LR at a save, are not finite before a checkpoint of the bad step or a
    later one is saved (`recipe.resilience.finite_guard`); writes a manifest beside each save and resumes from the
    newest
    checkpoint that is intact and loads, and names a full disk (`recipe.resilience.checkpoint_guard`); on SIGTERM, saves
    the step if `[resilience]` says so and ends with exit code 143 (`recipe.resilience.preemption`); runs dense SDPA
    after
    `[lighthouse] switch_to_dense_at_step` and on every `dense_every`-th step before it; collects statistics of
    the Lighthouse layers on every log step; after its first step, pins the host threads that drive the GPU to one
    CPU if `[host] colocate_autograd` says so."""

    def __init__(self, job_config: JobConfig, argv: Sequence[str] | None = None) -> None:
        tokenizer = check_start_up(job_config)
        # torchtitan builds the model from the flavor's arguments: give them the tokenizer's vocabulary first
        with as_config_error():
            use_tokenizer(use_hf_shape(get_train_spec(job_config.model.name).model_args[job_config.model.flavor],
                                       job_config), tokenizer)
        self.tokenizer_fingerprint = tokenizer_fingerprint(tokenizer)
        self.dump_lock = DumpFolderLock(job_config.job.dump_folder) if os.environ.get("RANK", "0") == "0" else None
        logger.info(f"Output folder: {os.path.abspath(job_config.job.dump_folder)}")
        if not job_config.checkpoint.last_save_in_hf:
            logger.addFilter(_not_hf_index_warning)
        building_line = _BuildingLineSpace(job_config)
        logger.addFilter(building_line)
        self.sigterm = SigtermFlag(lambda: restart_point(job_config))  # noted from here on, acted on between steps
        try:
            without_stop_records(Trainer.__init__)(self, job_config)
        except BaseException:
            self.sigterm.close()  # a job that ends here is stopped by SIGTERM as before (torchrun's other ranks)
            raise
        finally:
            logger.removeFilter(_not_hf_index_warning)
            logger.removeFilter(building_line)
        load, save = self.checkpointer.load, self.checkpointer.save
        self.checkpoint_folder = os.path.join(job_config.job.dump_folder, job_config.checkpoint.folder)
        initial, checksums = job_config.checkpoint.initial_load_path, job_config.resilience.checksums
        unverified = job_config.checkpoint.load_unverified
        self.checkpointer.load = lambda step=-1: self.load_checkpoint(load, step, initial, checksums, unverified)
        self.checkpointer.save = lambda curr_step, last_step=False: self.save_checkpoint(save, curr_step, last_step)
        self.last_save_s: float | None = None  # how long this process's latest save took
        self.async_save_step: int | None = None  # an asynchronous save still being written (no manifest yet)
        if job_config.comm.mode == "default":  # a dry run's fake process group has no other ranks to ask
            self.sigterm.join_ranks()
        self.switch_step = job_config.lighthouse.switch_to_dense_at_step
        self.dense_every = job_config.lighthouse.dense_every
        self.lighthouse_on = bool(self.model_args.lighthouse_layers())
        # The rank that logs metrics records the run (recipe/logs/run_record.py) when its first step starts, so a
        # rerun with nothing left to train leaves no record.
        self.argv, self.trained = argv, False
        self.finite_guard = FiniteGuard()
        self.pin_after_step = job_config.host.colocate_autograd
        training = job_config.training
        self.fused_loss = uses_fused_loss(job_config, tokens_per_rank(job_config, training.local_batch_size,
                                                                      training.seq_len), self.model_args.vocab_size)
        logger.info(f"[loss] {'fused output loss' if self.fused_loss else 'full logits'} "
                    f"(implementation={job_config.loss.implementation!r}, vocabulary {self.model_args.vocab_size:,})")
        self.host_pin = ExitStack()  # the pinned host threads' masks, given back by close()

    def save_checkpoint(self, save, curr_step: int, last_step: bool = False) -> None:
        """torchtitan's `save` on the steps it saves, after checking that what it would save is finite, with
        Ctrl-C held back until the save has finished; then the manifest (`recipe.resilience.checkpoint_manifest`) of
        every
        save whose files are now all written."""
        if not (checkpoint_due(self.job_config, curr_step) or (last_step and self.job_config.checkpoint.enable)):
            save(curr_step, last_step)
            return
        lrs = [group["lr"] for optimizer in self.optimizers for group in optimizer.param_groups]
        if (bad := non_finite_state(self.model_parts, self.optimizers, lrs)) is not None:
            raise NonFiniteStep(f"step {curr_step}: {bad} is not finite; stopped before saving it, so "
                                f"{last_good(self.checkpoint_folder)} (a lower optimizer.lr or training.max_norm "
                                "may avoid it)")
        begin = time.monotonic()
        with ctrl_c_held(f"during the save of step {curr_step}, which finished first"):
            save_or_stop(save, self.checkpoint_folder, curr_step, last_step)
            if last_step and self.checkpointer.last_save_in_hf:
                self.write_hf_files(curr_step)
            for step in self.saves_written(curr_step, last_step):
                self.write_step_manifest(step)
        self.last_save_s = time.monotonic() - begin

    def write_hf_files(self, step: int) -> None:
        """config.json, generation_config.json and the tokenizer files (`recipe.hf.config`) beside the safetensors of
        the last step's `[checkpoint] last_save_in_hf` save, so the folder loads in transformers as an export does;
        rank 0 writes, every rank waits for it (the manifest lists them)."""
        if not dist.is_initialized() or dist.get_rank() == 0:
            ffn_hidden = model_shapes(self.model_args)["layers.0.feed_forward.w1.weight"][0]
            write_hf_files(Path(self.checkpoint_folder) / f"step-{step}", self.model_args, ffn_hidden,
                           self.checkpointer.export_dtype, self.job_config)
        if dist.is_initialized():
            dist.barrier()

    def saves_written(self, curr_step: int, last_step: bool) -> list[int]:
        """The saves whose files are all written once torchtitan's save of `curr_step` has returned: the
        asynchronous save before it (torchtitan waits for that first), and this one unless it is asynchronous
        too (torchtitan saves the last step synchronously); one purged meanwhile (`keep_latest_k`) is left out.
        The newest asynchronous save gets its manifest at the first step boundary after every rank has written
        its files (`manifest_written_async_save`), or at the next save or SIGTERM, which wait for them; a job
        killed before then leaves it without one, and a resume passes it over as damaged."""
        written = [] if self.async_save_step is None else [self.async_save_step]
        self.async_save_step = None
        if self.checkpointer.async_mode == AsyncMode.DISABLED or last_step:
            written.append(curr_step)
        else:
            self.async_save_step = curr_step
        return [step for step in written if os.path.isdir(os.path.join(self.checkpoint_folder, f"step-{step}"))]

    def finish_async_save(self) -> None:
        """Wait for the asynchronous save still being written and write its manifest, so a job that stops
        before its next save (SIGTERM) leaves its newest checkpoint verified. Every rank calls it alike."""
        if self.async_save_step is None:
            return
        step, self.async_save_step = self.async_save_step, None
        self.checkpointer._async_wait()  # torchtitan's wait for its save future
        if dist.is_initialized():
            dist.barrier()  # rank 0's future includes `.metadata`: every rank lists the folder after it
        if os.path.isdir(os.path.join(self.checkpoint_folder, f"step-{step}")):  # not purged meanwhile
            self.write_step_manifest(step)

    def manifest_written_async_save(self) -> None:
        """Write the manifest of the asynchronous save being written once every rank's part of it is (asked at
        each step boundary while one is, every rank alike), so a job that fails later resumes from it verified."""
        if self.async_save_step is None:  # no asynchronous save in flight (a job without checkpoints never has one)
            return
        future = self.checkpointer.save_future
        if not self.sigterm.any_rank(future is not None and not future.done()):
            self.finish_async_save()

    def write_step_manifest(self, step: int) -> None:
        """The manifest of the checkpoint of `step`, whose files are all written
        (`recipe.resilience.checkpoint_manifest`)."""
        write_manifest(os.path.join(self.checkpoint_folder, f"step-{step}"),
                       data_parallel_degree(self.job_config, int(os.environ.get("WORLD_SIZE", "1"))),
                       self.job_config.resilience.checksums)

    def should_continue_training(self) -> bool:
        if self.sigterm.requested():
            self.stop_on_sigterm()
        self.manifest_written_async_save()
        return super().should_continue_training()

    def stop_on_sigterm(self) -> None:
        """Save this step if `[resilience]` says so and the save fits in the grace, then raise Terminated."""
        resilience, checkpointer = self.job_config.resilience, self.checkpointer
        self.finish_async_save()
        latest = resume_step(self.checkpoint_folder, self.job_config.checkpoint.load_unverified)
        since = self.sigterm.slowest(self.sigterm.seconds_since())  # every rank decides alike
        if latest == self.step or self.step == 0:
            what = f"step {self.step} is saved" if latest == self.step else "nothing was trained yet"
        elif not self.job_config.checkpoint.enable:
            what = "not saved (checkpoint.enable = false)"
        elif not save_on_sigterm(resilience.save_on_sigterm):
            where = " outside SLURM" if resilience.save_on_sigterm == "auto" else ""
            what = f"not saved ([resilience] save_on_sigterm={resilience.save_on_sigterm!r}{where})"
        elif self.last_save_s is not None and (
                since + self.sigterm.slowest(self.last_save_s) > resilience.sigterm_grace_s):
            what = (f"not saved: a save takes {self.last_save_s:.0f} s and {since:.0f} s of the "
                    f"[resilience] sigterm_grace_s={resilience.sigterm_grace_s:g} have passed")
        else:
            model_only, in_hf = checkpointer.last_save_model_only, checkpointer.last_save_in_hf
            checkpointer.last_save_model_only = checkpointer.last_save_in_hf = False  # a full save to resume from
            try:
                checkpointer.save(self.step, last_step=True)
            finally:
                checkpointer.last_save_model_only, checkpointer.last_save_in_hf = model_only, in_hf
            what = f"saved step-{self.step} in {self.last_save_s:.1f} s"
        raise Terminated(f"terminated (SIGTERM) at step {self.step}; {what}; a restart resumes from "
                         f"{restart_point(self.job_config)}")

    def load_checkpoint(self, load: Callable[[int], bool], step: int, initial: str, checksums: bool,
                        unverified: bool) -> bool:
        """torchtitan's `load` through `load_newest_intact`; a finished run whose last save holds weights alone is
        not loaded (nothing in it resumes a run) but taken as at its last step, so that `train` says nothing is left
        to train and the job exits 0, as it does after a full last save."""
        steps = self.job_config.training.steps
        if step == -1 and finished_weights(self.checkpoint_folder, steps, unverified):
            logger.info(f"{self.checkpoint_folder}/step-{steps} holds the finished run's weights alone")
            self.step = steps
            return True
        return load_newest_intact(load, self.checkpoint_folder, step, initial, checksums, unverified)

    def set_lighthouse(self, enabled: bool) -> None:
        """Lighthouse (True) or dense causal SDPA (False) in every Lighthouse layer of every model part."""
        for part in self.model_parts:
            part.set_lighthouse_enabled(enabled)

    def switch_to_dense(self) -> None:
        """Dense causal SDPA in every layer from now on; MFU accounting follows."""
        self.set_lighthouse(False)
        dense_args = dataclasses.replace(self.model_args, lighthouse=None)
        _, self.metrics_processor.num_flops_per_token = dense_args.get_nparams_and_flops(
            self.model_parts[0], self.job_config.training.seq_len
        )
        self.lighthouse_on = False
        logger.info(f"[lighthouse] switch_to_dense_at_step={self.switch_step}: dense SDPA from step {self.step}")

    def training_starts_filter(self, record: logging.LogRecord) -> bool:
        """Log filter: torchtitan says `Training starts at step N` after loading the checkpoint even when N is past
        training.steps; then the only line is `Nothing left to train`."""
        return self.step < self.job_config.training.steps or not record.getMessage().startswith("Training starts at")

    def train(self) -> None:
        logger.addFilter(self.training_starts_filter)
        try:
            with no_wait_for_other_ranks_alone():
                without_stop_records(Trainer.train)(self)
        finally:
            logger.removeFilter(self.training_starts_filter)
        if not self.trained:
            logger.info(f"Nothing left to train: the job resumed at step {self.step} of training.steps="
                        f"{self.job_config.training.steps}; raise --training.steps to train on, or pass another "
                        "--job.dump_folder to start over")

    def train_step(self, data_iterator: Iterator) -> None:
        if not self.trained and self.metrics_processor.jsonl is not None:
            record = write_run_record(self.job_config, self.argv, tokenizer=self.tokenizer_fingerprint,
                                      lighthouse_layers=self.model_args.lighthouse_layers())
            logger.info(f"Run record (config.toml, run.json): {record}")
            self.metrics_processor.jsonl.write(run_start_record(self.step, record))
        if not self.trained:
            training = self.job_config.training
            tokens = tokens_per_rank(self.job_config, training.local_batch_size, training.seq_len)
            logger.info(first_step_line(self.step, tokens, self.device.type))
        self.trained = True
        if self.lighthouse_on and 0 < self.switch_step < self.step:
            self.switch_to_dense()
        dense_step = self.lighthouse_on and self.dense_every > 0 and self.step % self.dense_every == 0
        observe = (
            self.lighthouse_on and not dense_step and self.job_config.lighthouse.log_stats
            and self.metrics_processor.should_log(self.step)
        )
        if observe:
            attach_observers(self.model_parts, self.metrics_processor.selection_stats)
        if dense_step:
            self.set_lighthouse(False)
        self.step_losses = []
        begin = time.monotonic()
        try:
            with recorded_grad_norms() as grad_norms:
                super().train_step(data_iterator)
            if line := slow_step_line(self.step, time.monotonic() - begin,
                                      self.metrics_processor.should_log(self.step)):
                logger.info(line)
        finally:
            if observe:
                attach_observers(self.model_parts, None)
            if dense_step:
                self.set_lighthouse(True)
        self.finite_guard.record(self.step, self.step_losses, grad_norms)
        if (self.metrics_processor.should_log(self.step) or self.step == self.job_config.training.steps
                or checkpoint_due(self.job_config, self.step)):  # steps that sync or save anyway
            self.finite_guard.check(self.step, self.checkpoint_folder)
        if self.pin_after_step:
            self.pin_after_step = False
            self.colocate_host_threads()

    def post_dataloading_process(self, input_dict, labels):
        """torchtitan's batch preparation (context-parallel sharding included), then the labels for the model where
        its output layer computes the loss (`[loss]`)."""
        inputs, labels, extra_inputs, extra_kwargs = super().post_dataloading_process(input_dict, labels)
        return inputs, labels, extra_inputs, with_labels(extra_kwargs, labels, self.fused_loss)

    def forward_backward_step(self, *args, **kwargs):
        loss = super().forward_backward_step(*args, **kwargs)
        self.step_losses.append(loss.detach())  # for the finite guard
        return loss

    def colocate_host_threads(self) -> None:
        """Pin this thread and autograd's device threads to one CPU until `close` (`[host] colocate_autograd`)."""
        cpu = self.host_pin.enter_context(colocated_autograd())
        logger.info(f"[host] colocate_autograd: the training thread and {len(autograd_threads())} autograd device "
                    f"thread(s) on CPU {cpu} from step {self.step + 1}")

    def close(self) -> None:
        self.sigterm.close()
        self.host_pin.close()
        super().close()
        if self.dump_lock is not None:
            self.dump_lock.release()


def main(argv: Sequence[str] | None = None, trainer_cls: type[LighthouseTrainer] | None = None) -> None:
    """Parse TOML + CLI (`--job.config_file ...`), then run like `torchtitan.train.main` with `trainer_cls`.

    A configuration mistake ends in one line on stderr and exit code 2 (`LIGHTHOUSE_DEBUG=1`: a traceback), an
    out-of-memory error in one line naming the knobs that set memory and exit code 1, Ctrl-C at any point (held
    until the settings are read, during saves and while closing: `recipe.resilience.held_signals`) in one line naming
    where
    a restart resumes and exit code 130.
    """
    init_logger()
    args = list(sys.argv[1:] if argv is None else argv)
    with exit_on_config_error():
        config = parse_job_config(args)
        trainer: LighthouseTrainer | None = None
        finished, step = False, 0
        try:
            try:
                release_ctrl_c()  # a Ctrl-C held since train.py's first line interrupts here
                trainer = (trainer_cls or LighthouseTrainer)(config, args)  # looked up now: tests replace the class
                if config.comm.mode == "local_tensor":
                    logger.info("Local tensor mode: the trainer is built, training is skipped")
                elif config.checkpoint.create_seed_checkpoint:
                    if int(os.environ["WORLD_SIZE"]) != 1:
                        raise ConfigError("create a seed checkpoint with one process (no sharding)")
                    trainer.checkpointer.save(curr_step=0, last_step=True)
                    logger.info("Created seed checkpoint")
                else:
                    trainer.train()
                finished = True
            except RuntimeError as err:
                if not is_out_of_memory(err):
                    raise
                raise OutOfMemory(out_of_memory_line(config, trainer.step if trainer is not None else 0, err)) from None
            finally:
                step = trainer.step if trainer is not None else 0
                with ctrl_c_held("while the job was closing", act=finished):  # closing is never cut short
                    if trainer is not None:
                        trainer.close()
                    trainer = None  # its device meshes hold the process groups, which must end before the interpreter
                    end_process_groups(finished)
        except KeyboardInterrupt as err:
            detail = f" ({err})" if str(err) else ""
            raise Interrupted(f"interrupted (Ctrl-C) at step {step}{detail}; a restart resumes from "
                              f"{restart_point(config)}") from None
        if take_sigterm() is not None:  # held while the job closed (train.py)
            raise Terminated(f"terminated (SIGTERM) while the job was closing after step {step}; a restart resumes "
                             f"from {restart_point(config)}")
