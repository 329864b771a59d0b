"""Dense-shadow validation: held-out loss under Lighthouse and under dense attention on the same weights.

A stage-1 loss computed with Lighthouse selection is not a dense loss: with `selection = "paper"` the model
reads the next tokens through the selection pattern (docs/causality.md), and even a causal selection sees
less context than dense attention. What a run will reach after the switch to dense is best predicted by the
dense loss of its current weights, so every `validation.freq` steps the validator scores the same held-out
windows twice while Lighthouse is on (`validation/lighthouse_loss`, `validation/dense_loss`), and once,
dense, otherwise. The windows are the first `validation.steps` batches of `validation.dataset` (the recipe's
`local` or `synthetic` sources), the same at every evaluation. Beside each per-token loss goes its bits per byte
(`validation/lighthouse_bits_per_byte`, `validation/dense_bits_per_byte`): the windows' nats over the UTF-8 bytes
of their target tokens (`recipe.data.tokenizer.token_bytes`; BOS and EOS have none), which compare runs across
tokenizers.
"""
from __future__ import annotations

import math
from dataclasses import asdict

import torch
from torch import nn
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.components.validate import Validator
from torchtitan.distributed import utils as dist_utils
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from recipe.data.loader import PackedDocuments, build_source
from recipe.data.tokenizer import token_bytes
from recipe.train.loss import tokens_per_rank, uses_fused_loss, with_labels

VALIDATION_DATASETS = ("local", "synthetic")
SYNTHETIC_SEED_OFFSET = 1_000_003  # synthetic held-out documents differ from the training ones


def check_validation(job_config) -> None:
    """Raise ValueError naming the key if `[validation]` is on but cannot give fixed held-out windows."""
    validation = job_config.validation
    if not validation.enable:
        return
    if validation.dataset not in VALIDATION_DATASETS:
        raise ValueError(
            f"validation.dataset={validation.dataset!r} is not one of {VALIDATION_DATASETS}: point "
            "validation.dataset_path at held-out files with validation.dataset = \"local\""
        )
    if validation.dataset == "local" and not validation.dataset_path:
        raise ValueError("validation.dataset = \"local\" needs validation.dataset_path (held-out files or a folder)")
    if validation.steps < 1:
        raise ValueError(f"validation.steps={validation.steps} must be >= 1: the held-out windows are its first "
                         "validation.steps batches, the same at every evaluation")
    if validation.freq < 1:
        raise ValueError(f"validation.freq={validation.freq} must be >= 1")
    if validation.local_batch_size < 1:
        raise ValueError(f"validation.local_batch_size={validation.local_batch_size} must be >= 1")
    if validation.seq_len > job_config.training.seq_len:
        raise ValueError(f"validation.seq_len={validation.seq_len} is longer than training.seq_len="
                         f"{job_config.training.seq_len}, the model's RoPE table; leave validation.seq_len unset "
                         "(train.py then takes training.seq_len) or set it <= training.seq_len")
    if job_config.parallelism.pipeline_parallel_degree > 1:
        raise ValueError("[validation] with pipeline_parallel_degree > 1 is not supported by the recipe's validator")


class DenseShadowValidator(Validator):
    """torchtitan's `Validator` on the recipe's datasets, scoring with Lighthouse and with dense attention.

    Built by the TrainSpec hook `build_dense_shadow_validator` with the arguments torchtitan passes; it reuses
    torchtitan's batch preparation (context-parallel sharding included) and its metrics processor.
    """

    def __init__(self, job_config, dp_world_size: int, dp_rank: int, tokenizer, parallel_dims, loss_fn,
                 validation_context, maybe_enable_amp, metrics_processor, **_pipeline) -> None:
        # Not Validator.__init__: it builds torchtitan's HF validation loader, which knows none of our datasets.
        # The settings were checked at start-up (`check_validation`, from `recipe.train.job_config.check_job_config`).
        self.job_config, self.tokenizer, self.parallel_dims, self.loss_fn = (job_config, tokenizer, parallel_dims,
                                                                             loss_fn)
        self.validation_context, self.maybe_enable_amp = validation_context, maybe_enable_amp
        self.metrics_processor = metrics_processor
        self.dp_world_size, self.dp_rank = dp_world_size, dp_rank
        self.pp_schedule = self.pp_has_first_stage = self.pp_has_last_stage = None
        self.token_bytes = token_bytes(tokenizer).to(utils.device_type)

    def heldout_batches(self) -> ParallelAwareDataloader:
        """A fresh loader of the held-out windows: every evaluation reads the same first batches."""
        validation = self.job_config.validation
        seed = (self.job_config.debug.seed or 0) + SYNTHETIC_SEED_OFFSET
        source = build_source(validation.dataset, validation.dataset_path, seed, validation.seq_len,
                              self.dp_rank, self.dp_world_size, section="validation",
                              skip_bad=self.job_config.data.bad_documents == "skip")
        return ParallelAwareDataloader(
            PackedDocuments(source, self.tokenizer, validation.seq_len), dp_rank=self.dp_rank,
            dp_world_size=self.dp_world_size, batch_size=validation.local_batch_size,
            **{**asdict(validation.dataloader), "num_workers": 0},
        )

    def mean_loss(self, model_parts: list[nn.Module]) -> tuple[float, float]:
        """Mean next-token loss over the held-out windows and data-parallel ranks, and bits per byte: the windows'
        nats over the UTF-8 bytes of their target tokens."""
        device_type = utils.device_type
        losses, nats, text_bytes = [], [], 0.0
        validation = self.job_config.validation
        fused = uses_fused_loss(self.job_config, tokens_per_rank(self.job_config, validation.local_batch_size,
                                                                 validation.seq_len),
                                model_parts[0].output.out_features)
        for batch, (input_dict, labels) in enumerate(self.heldout_batches()):
            if batch == self.job_config.validation.steps:
                break
            self.metrics_processor.ntokens_since_last_log += labels.numel()
            input_dict = {k: v.to(device_type) for k, v in input_dict.items()}
            labels = labels.to(device_type)
            # Counted before context-parallel sharding, as the training step does: each CP rank's loss sum
            # covers its shard, and the sum over the loss mesh (dp x cp) then divides by every token once.
            targets = labels != IGNORE_INDEX
            tokens, batch_bytes = targets.sum(), self.token_bytes[labels[targets]].sum()
            inputs, labels, extra_inputs, extra_kwargs = self.post_dataloading_process(input_dict, labels, model_parts)
            extra_kwargs = with_labels(extra_kwargs, labels, fused)
            if self.parallel_dims.dp_enabled:
                tokens = dist_utils.dist_sum(tokens, self.parallel_dims.get_mesh("batch"), None)
                batch_bytes = dist_utils.dist_sum(batch_bytes, self.parallel_dims.get_mesh("batch"), None)
            with self.validation_context(), self.maybe_enable_amp:
                loss_sum = self.loss_fn(model_parts[0](inputs, **extra_inputs, **extra_kwargs), labels)
            losses.append(loss_sum.detach() / tokens)
            nats.append(loss_sum.detach())
            text_bytes += float(batch_bytes)
        loss, nats = torch.stack(losses).sum() / len(losses), torch.stack(nats).sum()
        if self.parallel_dims.dp_cp_enabled:
            loss_mesh = self.parallel_dims.get_optional_mesh("loss")
            return dist_utils.dist_sum(loss, loss_mesh), dist_utils.dist_sum(nats, loss_mesh) / text_bytes / math.log(2)
        return loss.item(), nats.item() / text_bytes / math.log(2)

    def scores(self, attention: str, model_parts: list[nn.Module]) -> dict[str, float]:
        """`validation/<attention>_loss` and `validation/<attention>_bits_per_byte` of the model as it is set."""
        loss, bits_per_byte = self.mean_loss(model_parts)
        return {f"validation/{attention}_loss": loss, f"validation/{attention}_bits_per_byte": bits_per_byte}

    @torch.no_grad()
    def validate(self, model_parts: list[nn.Module], step: int) -> None:
        for model in model_parts:
            model.eval()
        lighthouse_on = any(model.lighthouse_enabled() for model in model_parts)
        metrics = {}
        try:
            if lighthouse_on:
                metrics.update(self.scores("lighthouse", model_parts))
                for model in model_parts:
                    model.set_lighthouse_enabled(False)
            metrics.update(self.scores("dense", model_parts))
        finally:
            for model in model_parts:
                model.set_lighthouse_enabled(lighthouse_on)
                model.train()
        logger.info("validation  " + "  ".join(f"{k.removeprefix('validation/')}: {v:.4f}" for k, v in metrics.items()))
        current = metrics["validation/lighthouse_loss" if lighthouse_on else "validation/dense_loss"]
        self.metrics_processor.log_validation(loss=current, step=step, extra_metrics=metrics)


def build_dense_shadow_validator(**kwargs) -> DenseShadowValidator:
    """TrainSpec hook replacing torchtitan's `build_validator` (same keyword arguments)."""
    return DenseShadowValidator(**kwargs)
