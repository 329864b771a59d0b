"""The TrainSpec `llama3_lighthouse`: the model package's Llama-3 with Lighthouse layers, wired into torchtitan
with the recipe's data, tokenizer (bytes, or the Hugging Face tokenizer of `[model] hf_assets_path`), metrics and
dense-shadow validation, and torchtitan's Llama-3 state dict adapter (Hugging Face weights in and out). Registered
on import, as torchtitan registers its own models; `recipe.train.trainer` imports it."""
from __future__ import annotations

import copy

from torchtitan.components.optimizer import build_optimizers
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.models.llama3 import Llama3StateDictAdapter
from torchtitan.protocols.train_spec import TrainSpec, register_train_spec

from models.llama3_lighthouse import FLAVORS, NAME, LighthouseLlama, LighthouseLlamaArgs, parallelize_lighthouse_llama

from recipe.data.loader import build_lighthouse_dataloader
from recipe.data.tokenizer import build_tokenizer, ids_needed, model_vocab_size
from recipe.hf.shape import HF_FLAVOR, apply_hf_shape, read_shape_config
from recipe.logs.metrics import build_lighthouse_metrics_processor
from recipe.train.loss import build_lighthouse_loss
from recipe.train.lr_schedule import build_lr_schedulers
from recipe.train.validation import build_dense_shadow_validator


def get_train_spec() -> TrainSpec:
    return TrainSpec(
        model_cls=LighthouseLlama,
        model_args=FLAVORS,
        parallelize_fn=parallelize_lighthouse_llama,
        pipelining_fn=pipeline_llm,
        build_optimizers_fn=build_optimizers,
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=build_lighthouse_dataloader,
        build_tokenizer_fn=build_tokenizer,
        build_loss_fn=build_lighthouse_loss,
        build_validator_fn=build_dense_shadow_validator,
        build_metrics_processor_fn=build_lighthouse_metrics_processor,
        state_dict_adapter=Llama3StateDictAdapter,
    )


def use_tokenizer(args: LighthouseLlamaArgs, tokenizer: BaseTokenizer) -> None:
    """Size the model's vocabulary for `tokenizer` (`model_vocab_size`; a shape from config.json keeps its own, which
    must hold the tokenizer's ids) and take its EOS."""
    if not args.hf_shape:
        args.vocab_size = model_vocab_size(tokenizer)
    elif (needed := ids_needed(tokenizer)) > args.vocab_size:
        raise ValueError(f"config.json has vocab_size={args.vocab_size}, but the tokenizer of model.hf_assets_path "
                         f"has ids up to {needed - 1}: it is another model's tokenizer")
    args.eos_id = tokenizer.eos_id


def use_hf_shape(args: LighthouseLlamaArgs, job_config) -> LighthouseLlamaArgs:
    """For `model.flavor = "hf"`, `args` with the shape and RoPE of config.json in `model.hf_assets_path` (RoPE
    stays the job's `[rope]` under `rope.change_imported`); `args` as they are otherwise."""
    if job_config.model.flavor == HF_FLAVOR:
        apply_hf_shape(args, read_shape_config(job_config), rope=not job_config.rope.change_imported)
    return args


def job_model_args(job_config, tokenizer: BaseTokenizer | None = None) -> LighthouseLlamaArgs:
    """The arguments of the job's model: its flavor's (`use_hf_shape`), updated from the job (`training.seq_len`,
    `[lighthouse]`, `[rope]`), with the vocabulary of its tokenizer (built from the job unless given)."""
    args = use_hf_shape(copy.deepcopy(FLAVORS[job_config.model.flavor]), job_config)
    args.update_from_config(job_config)
    use_tokenizer(args, tokenizer or build_tokenizer(job_config))
    return args


register_train_spec(NAME, get_train_spec())
