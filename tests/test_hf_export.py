"""scripts/export_hf.py: the exported folder loads in transformers and computes the recipe model's dense logits.

The checkpoint: train.py on CPU, the debug flavor (Lighthouse in layers 1..3) at sequence 256, two steps.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformers import AutoModelForCausalLM, AutoTokenizer

from eval.checkpoint import build_model, load_weights, parse_job_config
from eval.hf_export import RECORD_FILE, export
from recipe.launch import single_process_env
from recipe.run_record import source_commit
from recipe.tokenizer import NUM_BYTES, ByteTokenizer

from .helpers import child_env

pytestmark = pytest.mark.slow  # every test trains or loads a model trained in this module

REPO = Path(__file__).resolve().parents[1]

SEQ_LEN, STEPS = 256, 2
JOB = ["--job.config_file", "configs/debug.toml", "--training.seq_len", str(SEQ_LEN)]
# float32 rounding gives ~1e-6 of the largest logit; a wrong RMSNorm eps (1e-6 for 1e-5) already gives ~1e-4.
RELATIVE_TOLERANCE = 1e-5
TEXT = "Grüße, 世界! naïve café 🙂 <bos> literal <eos>\n\t\x00\x7f end"


@pytest.fixture(scope="module")
def step_folder(tmp_path_factory) -> Path:
    """The full checkpoint at the last step of a two-step Lighthouse run."""
    root = tmp_path_factory.mktemp("hf_export")
    argv = [*JOB, "--job.dump_folder", str(root / "run"), "--training.steps", str(STEPS), "--checkpoint.enable",
            "--lr_scheduler.warmup_steps", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), **single_process_env()}
    out = subprocess.run([sys.executable, "train.py", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return root / "run" / "checkpoint" / f"step-{STEPS}"


def export_hf(*argv: str) -> subprocess.CompletedProcess:
    """`python scripts/export_hf.py <argv>` from the repository root."""
    return subprocess.run([sys.executable, "scripts/export_hf.py", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=child_env())


@pytest.fixture(scope="module")
def exported(step_folder, tmp_path_factory) -> Path:
    """The folder export_hf.py writes for that checkpoint."""
    out = tmp_path_factory.mktemp("hf") / "model"
    run = export_hf(str(step_folder), str(out), *JOB)
    assert run.returncode == 0 and run.stdout == f"exported {step_folder} -> {out}\n", run.stderr[-4000:]
    return out


def assert_same_logits(model, hf_folder: Path) -> None:
    """Dense logits of `model` equal transformers' of `hf_folder` on random ids of the full training length."""
    model.set_lighthouse_enabled(False)
    hf_model = AutoModelForCausalLM.from_pretrained(hf_folder).eval()
    ids = torch.randint(0, model.vocab_size, (2, SEQ_LEN))
    with torch.no_grad():
        expected, actual = model(ids), hf_model(ids).logits
    error = (actual - expected).abs().max() / expected.abs().max()
    assert error < RELATIVE_TOLERANCE, f"max |logit difference| / max |logit| = {error:.2e}"


def test_transformers_computes_the_checkpoints_dense_logits(step_folder, exported):
    model = build_model(parse_job_config(JOB), torch.device("cpu"))
    load_weights(model, step_folder)
    assert_same_logits(model, exported)


def test_the_conversion_is_exact_on_weights_that_make_attention_depend_on_position(tmp_path):
    """Fresh N(0, 0.2^2) weights make attention sharp, so RoPE (theta, llama3 scaling, q/k layout) shows in logits."""
    job_config = parse_job_config(JOB)
    model = build_model(job_config, torch.device("cpu"))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    export(model, job_config, tmp_path, record={})
    assert_same_logits(model, tmp_path)


def test_autotokenizer_encodes_and_decodes_as_the_byte_tokenizer(exported):
    tokenizer, recipe_tokenizer = AutoTokenizer.from_pretrained(exported), ByteTokenizer()
    bos, eos = recipe_tokenizer.bos_id, recipe_tokenizer.eos_id
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (bos, eos)
    ids = tokenizer(TEXT).input_ids
    assert ids == recipe_tokenizer.encode(TEXT, add_bos=True, add_eos=False)
    assert tokenizer(TEXT, add_special_tokens=False).input_ids == recipe_tokenizer.encode(TEXT, False, False)
    assert tokenizer.decode(ids + [eos], skip_special_tokens=True) == TEXT
    # Every byte, also those no UTF-8 text holds (0xC0, 0xC1, 0xF5..0xFF): the same U+FFFD replacements.
    every_byte = [bos, *range(NUM_BYTES), eos]
    assert tokenizer.decode(every_byte, skip_special_tokens=True) == recipe_tokenizer.decode(every_byte)


def test_the_export_records_its_source(step_folder, exported):
    record = json.loads((exported / RECORD_FILE).read_text())
    assert record["checkpoint"] == str(step_folder)
    assert record["commit"] == source_commit(REPO)
    assert record["job_config"]["model"]["flavor"] == "debug"
    assert record["job_config"]["training"]["seq_len"] == SEQ_LEN


def test_a_folder_that_is_not_a_checkpoint_is_rejected(tmp_path):
    run = export_hf(str(tmp_path), str(tmp_path / "out"), *JOB)
    assert run.returncode == 2
    assert "is not a DCP checkpoint folder" in run.stderr
    assert not (tmp_path / "out").exists()


def test_a_non_empty_out_is_refused_unless_forced(step_folder, tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    run = export_hf(str(step_folder), str(tmp_path), *JOB)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and str(tmp_path) in run.stderr and "--force" in run.stderr
    assert not (tmp_path / "config.json").exists()

    assert export_hf(str(step_folder), str(tmp_path), "--force", *JOB).returncode == 0
    assert (tmp_path / "config.json").is_file() and (tmp_path / "notes.txt").read_text() == "keep"
