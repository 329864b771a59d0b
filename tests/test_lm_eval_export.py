"""lm-eval-harness on an export, with its defaults: the documented `lm_eval --model hf` command over the local tasks
in eval/metrics/lm_eval_tasks (from any working directory) gives the recipe model's own log-likelihoods, for whole
documents (rolling: each document's bytes after BOS, nothing for BOS itself, in windows of the training length:
eval.metrics.heldout.document_loss, scripts/heldout_loss.py --documents) and for continuations after a context.

The model: the debug flavor with fresh N(0, 0.2^2) weights (sharp attention, so positions and the tokens in the
context show in every number), exported by recipe/hf/export.py. No network: the tasks read local files.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eval.checkpoint import logits_function
from eval.metrics.heldout import document_loss, token_losses
from recipe.data.tokenizer import ByteTokenizer
from recipe.hf.export import export

from .helpers import sharp_random_model

pytestmark = pytest.mark.slow  # lm_eval starts in its own process and loads the model (about a minute)

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "eval" / "metrics" / "lm_eval_tasks"
SEQ_LEN = 256  # docs.jsonl's last document is longer: lm-eval scores it in three windows
JOB = ["--job.config_file", "configs/debug.toml", "--training.seq_len", str(SEQ_LEN), "--lighthouse.no-enable"]
# Sums of ~100 float32 log-probabilities computed in two orders: ~1e-5 apart. log p(BOS | BOS) is nats.
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def model_and_export(tmp_path_factory):
    """The recipe model with random weights, and its export."""
    job_config, model = sharp_random_model(JOB)
    out = tmp_path_factory.mktemp("lm_eval") / "model"
    export(model, job_config, out, record={})
    return logits_function(model, job_config, torch.device("cpu")), out


@pytest.fixture(scope="module")
def samples(model_and_export, tmp_path_factory) -> dict[str, list[dict]]:
    """lm_eval's logged samples per task, from the command docs/recipe.md gives, run offline in a working folder
    other than the repository root."""
    _, export_folder = model_and_export
    results = tmp_path_factory.mktemp("lm_eval_results")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(results / "hf_home")}
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={export_folder}",
               "--include_path", str(TASKS), "--tasks", "lighthouse_docs,lighthouse_choice",
               "--device", "cpu", "--batch_size", "4", "--output_path", str(results), "--log_samples"]
    run = subprocess.run(command, cwd=results, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    found = {}
    for task in ("lighthouse_docs", "lighthouse_choice"):
        (path,) = results.rglob(f"samples_{task}_*.jsonl")
        found[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return found


def recipe_loglikelihood(logits_fn, context: list[int], continuation: list[int]) -> float:
    """log p(continuation | context) by the recipe's loss computation (eval/metrics/heldout.py's token losses)."""
    ids = torch.tensor([context + continuation])
    losses = token_losses(logits_fn, ids[:, :-1], ids[:, 1:])
    return -losses[0, -len(continuation):].sum().item()


def local_documents(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS / name).read_text(encoding="utf-8").splitlines()]


def test_rolling_loglikelihood_is_each_documents_bytes_after_bos(model_and_export, samples):
    logits_fn, _ = model_and_export
    tokenizer = ByteTokenizer()
    documents = local_documents("docs.jsonl")
    assert [sample["doc"] for sample in sorted(samples["lighthouse_docs"], key=lambda s: s["doc_id"])] == documents
    assert max(len(d["text"].encode("utf-8")) for d in documents) > 2 * SEQ_LEN
    for sample in samples["lighthouse_docs"]:
        text = sample["doc"]["text"]
        if len(text.encode("utf-8")) <= SEQ_LEN:  # one window: the recipe's plain loss of the bytes after BOS
            expected = recipe_loglikelihood(logits_fn, [tokenizer.bos_id], tokenizer.encode(text, False, False))
            (actual,) = sample["filtered_resps"]
            assert abs(float(actual) - expected) < TOLERANCE, (text, actual, expected)
        assert sample["bits_per_byte"][1] == len(text.encode("utf-8"))


def test_the_per_document_held_out_loss_is_lm_evals_rolling_score(model_and_export, samples):
    """eval.metrics.heldout.document_loss (heldout_loss.py --documents) gives each document's lm-eval score, long ones
    included, and over all of them lm-eval's nats per byte."""
    logits_fn, _ = model_and_export
    texts, scores = [], []
    for sample in sorted(samples["lighthouse_docs"], key=lambda s: s["doc_id"]):
        text = sample["doc"]["text"]
        nats, count = document_loss(logits_fn, [text], SEQ_LEN)
        (actual,) = sample["filtered_resps"]
        assert count == len(text.encode("utf-8")) and abs(float(actual) + nats * count) < TOLERANCE, text
        texts.append(text)
        scores.append(float(actual))
    nats, count = document_loss(logits_fn, texts, SEQ_LEN)
    assert nats == pytest.approx(-sum(scores) / count, abs=1e-5)


def test_loglikelihood_of_a_continuation_is_conditioned_on_the_context_as_given(model_and_export, samples):
    logits_fn, _ = model_and_export
    tokenizer = ByteTokenizer()
    for sample in samples["lighthouse_choice"]:
        context = tokenizer.encode(sample["doc"]["context"], False, False)
        for choice, (actual, _) in zip(sample["doc"]["choices"], sample["filtered_resps"]):
            expected = recipe_loglikelihood(logits_fn, context, tokenizer.encode(" " + choice, False, False))
            assert abs(float(actual) - expected) < TOLERANCE, (sample["doc"], choice, actual, expected)
