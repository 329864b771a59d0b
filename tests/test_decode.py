"""The KV cache of scripts/generate.py (eval/metrics/decode.py): the same logits and tokens as the model's forward
over the whole window, before and after the sequence outgrows the window."""
from __future__ import annotations

import random
import runpy

import pytest
import torch

import models  # noqa: F401  (registers the llama3_lighthouse TrainSpec)
from eval.checkpoint import build_model, logits_function
from eval.metrics.decode import KVCacheDecoder, uncached
from recipe.data.tokenizer import ByteTokenizer
from recipe.train.cli import parse_job_config

from .helpers import REPO

WINDOW = 24
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def dense_model():
    torch.manual_seed(random.randrange(2**31))
    config = parse_job_config(["--job.config_file", "configs/debug.toml", "--lighthouse.no-enable",
                               "--training.seq_len", str(WINDOW)])
    return build_model(config, CPU), config


def test_cached_logits_are_the_forwards_at_every_length_across_the_window(dense_model):
    model, config = dense_model
    reference = uncached(logits_function(model, config, CPU), WINDOW)
    decoder = KVCacheDecoder(model, WINDOW, CPU)
    ids = [random.randrange(258) for _ in range(WINDOW + 6)]
    for length in range(1, len(ids) + 1):
        cached, full = decoder.next_logits(ids[:length]), reference(ids[:length])
        assert torch.allclose(cached, full, atol=1e-5, rtol=1e-4), (length, (cached - full).abs().max())


def test_cached_and_uncached_generation_give_the_same_tokens(dense_model):
    model, config = dense_model
    sample = runpy.run_path(str(REPO / "scripts" / "generate.py"))["sample"]
    prompt = ByteTokenizer().encode("def ", add_bos=True, add_eos=False)
    tokens = [sample(next_logits, prompt, 2 * WINDOW, ByteTokenizer(), temperature=0)
              for next_logits in (KVCacheDecoder(model, WINDOW, CPU).next_logits,
                                  uncached(logits_function(model, config, CPU), WINDOW))]
    assert tokens[0] == tokens[1]


def test_the_cache_refuses_a_lighthouse_model():
    config = parse_job_config(["--job.config_file", "configs/debug.toml"])
    with pytest.raises(ValueError, match="decodes dense attention"):
        KVCacheDecoder(build_model(config, CPU), config.training.seq_len, CPU)
