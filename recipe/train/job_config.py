"""The `[lighthouse]` TOML section (a torchtitan JobConfig extension) and the start-up checks of a job.

`train.py` always reads it (`recipe.train.cli`); tools that use torchtitan's own ConfigManager load it with
`[job] custom_config_module = "recipe.train.job_config"` (torchtitan 0.2.2 merges this module's `JobConfig` into
its own; the deprecated `[experimental] custom_args_module` does not).
"""
# No `from __future__ import annotations`: torchtitan merges these dataclasses into its own and tyro must
# resolve the field types outside this module.
import math
import os
import textwrap
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Callable, Literal, get_type_hints

import docstring_parser

from torchtitan.tools.logging import logger

from lighthouse import LighthouseConfig
from lighthouse.context_parallel import check_context_parallel

from models.llama3_lighthouse.dense import check_dense_backend
from recipe.resilience.checkpoint_guard import (check_entry_shapes, checkpoint_entries, complete_steps, resume_step,
                                                 unfinished_steps, weights_only)
from recipe.train.validation import check_validation


def _layer_fields() -> type:
    """A mutable dataclass with `LighthouseConfig`'s fields, types, defaults and field docs (as an
    "Attributes:" docstring, where tyro's `--help` finds them): the layer settings of the `[lighthouse]`
    section, written once, in `lighthouse/config.py`."""
    types, docs = get_type_hints(LighthouseConfig), {
        p.arg_name: p.description for p in docstring_parser.parse_from_object(LighthouseConfig).params}
    layer = make_dataclass("LighthouseLayer", [(f.name, types[f.name], field(default=f.default))
                                               for f in fields(LighthouseConfig)])
    attributes = "".join(f"    {name}: {textwrap.indent(docs[name], ' ' * 8).strip()}\n" for name in docs)
    layer.__doc__ = ("The settings of each Lighthouse layer (`lighthouse.LighthouseConfig`).\n\n"
                     f"Attributes:\n{attributes}")
    layer.__module__ = __name__
    return layer


LighthouseLayer = _layer_fields()


@dataclass
class Lighthouse(LighthouseLayer):
    """The `[lighthouse]` section: the layer settings (`LighthouseLayer`) plus where and when they run."""

    enable: bool = True
    """Run Lighthouse attention in every layer except `dense_layers` (false: dense causal SDPA everywhere)."""

    dense_layers: list[int] = field(default_factory=list)
    """Layer indices that keep dense causal SDPA (the paper: 0, 1, 28, 29 of 30)."""

    dense_backend: str = "auto"
    """Kernel of dense causal attention: in `dense_layers`, after `switch_to_dense_at_step`, on `dense_every`
    steps and in a dense run or resume (stage 2). "auto": FlashAttention-4 where installed and measured faster
    for the card at this length (`lighthouse.flash_attn.AUTO_FROM`, docs/cluster.md), else torchtitan's SDPA;
    "cudnn": torchtitan's SDPA always (cuDNN, or its flash and math kernels where cuDNN does not take the call);
    "flash_attn": FlashAttention-4 always (the flash extra)."""

    switch_to_dense_at_step: int = 0
    """Run Lighthouse for steps 1..N, then dense SDPA in every layer from step N+1 (0 = never). One run
    that matches a stage-1 run of `training.steps = N` followed by a stage-2 dense resume."""

    dense_every: int = 0
    """While Lighthouse is on, run every n-th step (steps n, 2n, ...) with dense SDPA in every layer, so stage 1
    keeps training the weights under the attention stage 2 will use (0 = never). The steps' data, optimizer and LR
    are the usual ones: only the attention of that step differs. Measured at 131,072 tokens (docs/results.md):
    4 kept the dense shadow on the dense curve but ended worse than 0 in both seeds, hence off."""

    log_stats: bool = True
    """Log selection statistics (S, expanded share, evenness) at every log step: one extra selection pass
    per Lighthouse layer on those steps. Under context parallelism the values are the whole sequence's."""

    def to_config(self) -> LighthouseConfig:
        """The layer settings as the algorithm's frozen config (checked: ValueError names a bad value)."""
        return LighthouseConfig(**{f.name: getattr(self, f.name) for f in fields(LighthouseConfig)})


@dataclass
class Host:
    colocate_autograd: bool = False
    """After the first step this process runs (so torch.compile's workers keep every CPU), pin the training
    thread and autograd's device threads to one CPU (`lighthouse.host_threads`; each local rank its own CPU
    of the process's mask). Where the host bounds the step (short sequences) and waking a thread on another
    core is slow (a virtual machine), this can shorten the step; on the paper model at 8K it moved Lighthouse's
    tok/s both ways between machines (docs/benchmarks.md, round 6), hence off. Threads and processes the
    training thread starts later share that CPU. Linux only."""


@dataclass
class Data:
    bad_documents: Literal["stop", "skip"] = "stop"
    """A `local` document that cannot be read mid-run (bytes that are not UTF-8, a malformed JSON line): "stop"
    ends the job with one line naming the file and byte offset; "skip" leaves it out with a counted warning."""


@dataclass
class LRScheduler:
    """Fields added to torchtitan's `[lr_scheduler]` (`recipe.train.lr_schedule`)."""

    rewarm_at_step: int = 0
    """Restart the warm-up after this step (0 = never), e.g. the switch to dense attention: the learning rate
    rises linearly from the schedule's value there back to the peak over `rewarm_steps` steps, then decays to
    `min_lr_factor` at the schedule's end with `decay_type`."""

    rewarm_steps: int = 0
    """Steps of the re-warm from `rewarm_at_step` (0 = no re-warm). Measured at 131,072 tokens: docs/results.md."""


@dataclass
class Checkpoint:
    """Fields added to torchtitan's `[checkpoint]` (`recipe.resilience.checkpoint_guard`)."""

    load_unverified: bool = False
    """Resume from a step of the job's own checkpoint folder that has no manifest.json (one saved by another
    program, or a save cut between DCP's .metadata and the manifest) or whose manifest records no checksums
    ([resilience] checksums = false), with a warning that it is unverified. Off, such a step counts as damaged:
    a resume falls back to the newest intact one."""


@dataclass
class Resilience:
    checksums: bool = True
    """Record the CRC-32 of every file a checkpoint save writes (in the step's manifest.json, beside the file sizes
    and the data-parallel degree, which are always recorded) and check them before a resume loads the step; a
    damaged step gives way to the newest intact one. Off, the steps are unverified, so the job needs
    checkpoint.load_unverified to resume them. Measured on a CPU for the paper model's checkpoint (3.2 GB):
    0.8-0.9 GiB/s per rank, split over the ranks, about a fifth added to a save (docs/recipe.md)."""

    save_on_sigterm: Literal["auto", "on", "off"] = "auto"
    """On SIGTERM (what SLURM sends before it kills a job at its time limit or on preemption), save the current
    step if the save can finish within sigterm_grace_s, then exit 143 with one line; "auto" is on under SLURM
    (SLURM_JOB_ID set). Off, SIGTERM still ends the job after its current step, in one line, without a save."""

    sigterm_grace_s: float = 30.0
    """Seconds between SIGTERM and the SIGKILL that follows (SLURM's KillWait, 30 by default): a save is started
    only if the time since SIGTERM plus the last save's duration fits in it."""


@dataclass
class Rope:
    """The `[rope]` section: torchtitan's Llama-3 RoPE (a base frequency with llama3 frequency scaling, always
    applied). The defaults are the flavors' (the paper's); context extension sets a larger `theta` or a larger
    `scaling_factor` for the long length (docs/recipe.md), and a Hugging Face model is imported with its own."""

    theta: float = 500000.0
    """Base frequency of the rotary embedding (Hugging Face's `rope_theta`)."""

    scaling_factor: float = 8.0
    """Llama-3 frequency scaling: the low-frequency bands are divided by it (1 = no scaling)."""

    low_freq_factor: float = 1.0
    """Llama-3 scaling: wavelengths above original_max_position_embeddings / low_freq_factor are scaled fully."""

    high_freq_factor: float = 4.0
    """Llama-3 scaling: wavelengths below original_max_position_embeddings / high_freq_factor are not scaled."""

    original_max_position_embeddings: int = 8192
    """Llama-3 scaling: the context length the unscaled frequencies were trained for."""

    change_imported: bool = False
    """Start from a Hugging Face folder (checkpoint.initial_load_in_hf) whose config.json states another RoPE than
    this section, on purpose: context extension of an imported model with a new theta or scaling for the long
    length. Off, such a start is refused in one line that gives the flags carrying the folder's RoPE."""


@dataclass
class Loss:
    """The `[loss]` section: how the output layer and the cross-entropy run (`recipe.train.loss`)."""

    implementation: Literal["auto", "fused", "full"] = "auto"
    """"full": the output layer's logits [tokens, vocab], then cross-entropy on them in float32. "fused": the output
    layer and the loss together, chunk_tokens tokens at a time (bf16 matmuls, float32 log-sum-exp, the gradients
    computed in the forward while each chunk's logits exist), so the logits never exist whole. "auto": fused where
    one rank's float32 logits would exceed fused_above_gib (a 128,256-entry vocabulary at 98,304 tokens: 47 GiB),
    else full (the byte model's 258 entries at 1M tokens: 1.0 GiB)."""

    chunk_tokens: int = 2048
    """Tokens per chunk of the fused loss; its largest tensor is one chunk's float32 logits (2,048 x 128,256: 1 GiB)."""

    fused_above_gib: float = 2.0
    """"auto" takes the fused loss where the full float32 logits of one rank's microbatch exceed this many GiB."""


@dataclass
class JobConfig:
    lighthouse: Lighthouse = field(default_factory=Lighthouse)
    rope: Rope = field(default_factory=Rope)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    host: Host = field(default_factory=Host)
    data: Data = field(default_factory=Data)
    resilience: Resilience = field(default_factory=Resilience)
    loss: Loss = field(default_factory=Loss)


def _check_dense_layers(dense_layers: list[int], n_layers: int) -> None:
    outside = [i for i in dense_layers if not 0 <= i < n_layers]
    if outside:
        raise ValueError(
            f"[lighthouse] dense_layers={list(dense_layers)} has {outside} outside the model's "
            f"{n_layers} layers (0..{n_layers - 1})"
        )
    repeated = sorted({i for i in dense_layers if dense_layers.count(i) > 1})
    if repeated:
        raise ValueError(f"[lighthouse] dense_layers={list(dense_layers)} repeats {repeated}")


def _check_context_parallel_layout(job_config) -> None:
    """Lighthouse context parallelism expects torchtitan's head/tail layout."""
    cp = job_config.parallelism.context_parallel_degree
    balancer = job_config.parallelism.context_parallel_load_balancer
    if cp > 1 and balancer != "headtail":
        raise ValueError(
            f"parallelism.context_parallel_load_balancer={balancer!r} with context_parallel_degree={cp}: "
            "Lighthouse layers need 'headtail'"
        )


def starts_from_initial_load(job_config) -> bool:
    """Whether the job loads `checkpoint.initial_load_path`: checkpointing is on, the path is set, and the job has
    no checkpoint folder of its own (torchtitan then resumes that and ignores the path)."""
    checkpoint = job_config.checkpoint
    return bool(checkpoint.enable and checkpoint.initial_load_path
                and not os.path.exists(os.path.join(job_config.job.dump_folder, checkpoint.folder)))


def resolve_initial_load(job_config) -> str | None:
    """`checkpoint.initial_load_path` may name another job's checkpoint folder (its `step-N` folders) rather than
    one step: the job then starts from the folder's newest complete step whose manifest lists its files, the step
    a restart of that job would resume (`recipe.resilience.checkpoint_guard.resume_step`, with this job's
    `load_unverified`), and the setting is rewritten to that step folder, so the run record names it. Returns the
    step folder taken, None when the setting is left as it is; ValueError when the folder holds step folders and
    none of them will do. Called before `check_initial_load`, on every rank (a finished job's folder reads the same
    on each)."""
    checkpoint, path = job_config.checkpoint, job_config.checkpoint.initial_load_path
    if (not starts_from_initial_load(job_config) or checkpoint.initial_load_in_hf or not os.path.isdir(path)
            or os.path.isfile(os.path.join(path, ".metadata"))):
        return None
    steps = sorted(complete_steps(path) + unfinished_steps(path))
    if not steps:
        return None
    step = resume_step(path, checkpoint.load_unverified)
    if step is None:
        raise ValueError(f"checkpoint.initial_load_path={path!r} is a checkpoint folder, but none of its steps "
                         f"({', '.join(f'step-{n}' for n in steps)}) is complete with a manifest that lists its files; "
                         "name one step-N folder, or pass --checkpoint.load_unverified to take one without a manifest")
    checkpoint.initial_load_path = os.path.join(path, f"step-{step}")
    logger.info(f"checkpoint.initial_load_path: {path} -> {checkpoint.initial_load_path} (its newest complete step)")
    return checkpoint.initial_load_path


def check_initial_load(job_config, model_shapes: Callable[[], dict[str, tuple[int, ...]]] | None = None,
                       hf_import: Callable[[], None] | None = None) -> None:
    """Raise ValueError if the checkpoint the job would start from cannot serve it (the trainer checks this at
    start, after `check_job_config`: the paper's stage 2 names a checkpoint that stage 1 has yet to write).

    `checkpoint.initial_load_path` must be a folder with a readable `.metadata`, or in HF format
    (`checkpoint.initial_load_in_hf`) one that `hf_import()` accepts (`recipe.hf.importer.check_hf_import`),
    and a full resume from it (model, optimizer, LR, data position, step) needs a checkpoint that holds them
    all; torchtitan would stop at `Missing key ... dataloader.dp_rank_0` after building the model. Its weights
    must have the shapes of this job's model (`model_shapes()`: parameter name -> shape), else it is another
    flavor's checkpoint."""
    checkpoint, path = job_config.checkpoint, job_config.checkpoint.initial_load_path
    if not starts_from_initial_load(job_config):
        return  # nothing to load, or torchtitan resumes from the job's own checkpoints and ignores initial_load_path
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint.initial_load_path={path!r} is not a folder")
    if checkpoint.initial_load_in_hf:
        if hf_import is not None:
            hf_import()
        return
    keys = checkpoint_entries(path, "checkpoint.initial_load_path")
    if model_shapes is not None:
        check_entry_shapes(keys, model_shapes(), path, "checkpoint.initial_load_path",
                           f"model.flavor={job_config.model.flavor!r}")
    if not checkpoint.initial_load_model_only and weights_only(keys):
        raise ValueError(
            f"checkpoint.initial_load_path={path!r} holds model weights only (its run saved its last step with "
            "checkpoint.last_save_model_only = true), but checkpoint.initial_load_model_only = false asks for the "
            "optimizer, LR schedule, data position and step too: point initial_load_path at an earlier step-N "
            "folder of that run (interval checkpoints are full), rerun it with last_save_model_only = false, or "
            "pass --checkpoint.initial_load_model_only to start from its weights alone at step 0"
        )


def check_rope(rope: Rope) -> None:
    """`[rope]` values torchtitan's RoPE can use (it divides by the factors and their difference)."""
    for key in ("theta", "scaling_factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if not 0 < getattr(rope, key) < math.inf:
            raise ValueError(f"[rope] {key}={getattr(rope, key)} must be a finite number > 0")
    if not rope.high_freq_factor > rope.low_freq_factor:
        raise ValueError(f"[rope] high_freq_factor={rope.high_freq_factor} must be above "
                         f"low_freq_factor={rope.low_freq_factor}")


def check_loss(job_config) -> None:
    """`[loss]` values the job can use: the fused loss needs the whole output weight on each rank."""
    loss, parallelism = job_config.loss, job_config.parallelism
    if loss.implementation not in ("auto", "fused", "full"):
        raise ValueError(f"[loss] implementation={loss.implementation!r} must be 'auto', 'fused' or 'full'")
    if loss.chunk_tokens < 1:
        raise ValueError(f"[loss] chunk_tokens={loss.chunk_tokens} must be >= 1")
    if not loss.fused_above_gib >= 0:
        raise ValueError(f"[loss] fused_above_gib={loss.fused_above_gib} must be >= 0")
    if loss.implementation == "fused":
        for key in ("tensor_parallel_degree", "pipeline_parallel_degree"):
            if getattr(parallelism, key) > 1:
                raise ValueError(f"[loss] implementation='fused' with parallelism.{key}={getattr(parallelism, key)}: "
                                 "the fused loss needs the whole output layer on each rank; use 'full' (or 'auto')")


def check_job_config(job_config, n_layers: int) -> None:
    """Raise ValueError naming the offending values if the job cannot run; no device is touched.

    Checks the step count, `[rope]`, `[validation]`, the `[lighthouse]` section against the model
    (`n_layers`) and every sequence length the job runs Lighthouse on, and the parallelisms this model supports.
    """
    section = getattr(job_config, "lighthouse", None)
    if section is None:
        raise ValueError(
            f"model.name={job_config.model.name!r} reads the [lighthouse] section: "
            "set [job] custom_config_module = \"recipe.train.job_config\""
        )
    if job_config.training.steps < 1:
        raise ValueError(f"training.steps={job_config.training.steps} must be >= 1")
    check_rope(job_config.rope)
    check_loss(job_config)
    check_validation(job_config)
    if job_config.host.colocate_autograd and not hasattr(os, "sched_setaffinity"):
        raise ValueError("[host] colocate_autograd=true needs Linux (os.sched_setaffinity); set it to false")
    _check_dense_layers(section.dense_layers, n_layers)
    try:
        check_dense_backend(section.dense_backend)
    except ValueError as err:
        raise ValueError(f"[lighthouse] {err}") from err
    if section.switch_to_dense_at_step < 0:
        raise ValueError(f"[lighthouse] switch_to_dense_at_step={section.switch_to_dense_at_step} must be >= 0")
    cp = job_config.parallelism.context_parallel_degree
    if section.enable and job_config.checkpoint.enable and job_config.checkpoint.last_save_model_only:
        logger.warning(
            "checkpoint.last_save_model_only=true: the last checkpoint of this run holds weights only, so a "
            "stage-2 dense resume cannot continue its optimizer, LR and data; set it to false for stage 1"
        )
    if section.dense_every < 0 or section.dense_every == 1:
        raise ValueError(f"[lighthouse] dense_every={section.dense_every} must be 0 (never) or >= 2 (1 would make "
                         "every step dense: set enable=false instead)")
    if not section.enable:
        for key in ("switch_to_dense_at_step", "dense_every"):
            if getattr(section, key):
                raise ValueError(f"[lighthouse] {key}={getattr(section, key)} with enable=false: "
                                 "there is no Lighthouse phase to apply it to")
        return
    _check_context_parallel_layout(job_config)
    try:
        config = section.to_config()  # mistakes at any length are named as such, not as a misfit with seq_len
    except ValueError as err:
        raise ValueError(f"[lighthouse] {err}") from err
    seq_lens = {"training.seq_len": job_config.training.seq_len}
    if job_config.validation.enable:
        seq_lens["validation.seq_len"] = job_config.validation.seq_len
    for name, seq_len in seq_lens.items():
        try:
            if cp > 1:
                check_context_parallel(config, seq_len, cp)
            else:
                config.validate(seq_len)
        except ValueError as err:
            raise ValueError(f"[lighthouse] does not fit {name}={seq_len}: {err}") from err
