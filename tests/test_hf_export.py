"""scripts/export_hf.py: the exported folder follows the checkpoint's own run, loads in transformers without
warnings, computes the recipe model's dense logits and batches, pads and generates as users expect.

The checkpoints: one train.py run on CPU, the debug flavor (Lighthouse in layers 1..3) at sequence 256, two
steps, switching to dense after step 1: step-1 is a stage-1 checkpoint, step-2 a dense one.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import random
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Iterator

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from eval.checkpoint import build_model, load_weights, parse_job_config
from recipe.data.tokenizer import EOS_ID, NUM_BYTES, ByteTokenizer
from recipe.hf.export import RECORD_FILE, WEIGHTS_FILE, export
from recipe.launch import single_process_env
from recipe.logs.run_record import source_commit

from .helpers import sharp_random_model

from .helpers import child_env, run_without_torch
from .warm_python import run_python

pytestmark = pytest.mark.slow  # every test trains or loads a model trained in this module

REPO = Path(__file__).resolve().parents[1]

SEQ_LEN, STEPS = 256, 2  # configs/debug.toml says 512: the export must take the run's 256
JOB = ["--job.config_file", "configs/debug.toml", "--training.seq_len", str(SEQ_LEN)]
RUN_JOB = [*JOB, "--lighthouse.switch_to_dense_at_step", "1"]  # the job of the run that trains the checkpoints
# float32 rounding gives ~1e-6 of the largest logit; a wrong RMSNorm eps (1e-6 for 1e-5) already gives ~1e-4.
RELATIVE_TOLERANCE = 1e-5
TEXT = "Grüße, 世界! naïve café 🙂 <bos> literal <eos>\n\t\x00\x7f end"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """The checkpoint folder of a two-step run with Lighthouse in step 1 and dense attention in step 2."""
    root = tmp_path_factory.mktemp("hf_export")
    argv = [*RUN_JOB, "--job.dump_folder", str(root / "run"), "--training.steps", str(STEPS), "--checkpoint.enable",
            "--checkpoint.interval", "1", "--lr_scheduler.warmup_steps", "1"]
    out = run_python(["train.py", *argv], env={**child_env(), **single_process_env()}, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return root / "run" / "checkpoint"


@pytest.fixture(scope="module")
def step_folder(checkpoints) -> Path:
    """The dense (stage-2) checkpoint: the last step, trained after the switch."""
    return checkpoints / f"step-{STEPS}"


def export_hf(*argv: str) -> subprocess.CompletedProcess:
    """`python scripts/export_hf.py <argv>` from the repository root."""
    return run_python(["scripts/export_hf.py", *argv], env=child_env(), timeout=300)


def _script_module():
    spec = importlib.util.spec_from_file_location("export_hf", REPO / "scripts" / "export_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


export_main = _script_module().main  # in this process: no interpreter start per export


def refused(capsys, *argv: str) -> str:
    """The single line export_hf.py prints when it refuses `argv` (exit code 2, no traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        export_main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("export_hf.py: error: "), err
    return err


@pytest.fixture(scope="module")
def export_run(step_folder, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """export_hf.py on the dense checkpoint, given no job arguments: the folder it writes and the process."""
    out = tmp_path_factory.mktemp("hf") / "model"
    run = export_hf(str(step_folder), str(out))
    assert run.returncode == 0 and run.stdout == f"exported {step_folder} -> {out}\n", run.stderr[-4000:]
    return out, run


@pytest.fixture(scope="module")
def exported(export_run) -> Path:
    """The folder export_hf.py writes for the dense checkpoint."""
    return export_run[0]


def assert_same_logits(model, hf_folder: Path) -> None:
    """Dense logits of `model` equal transformers' of `hf_folder` on random ids of the full training length."""
    model.set_lighthouse_enabled(False)
    hf_model = AutoModelForCausalLM.from_pretrained(hf_folder).eval()
    ids = torch.randint(0, model.vocab_size, (2, SEQ_LEN))
    with torch.no_grad():
        expected, actual = model(ids), hf_model(ids).logits
    error = (actual - expected).abs().max() / expected.abs().max()
    assert error < RELATIVE_TOLERANCE, f"max |logit difference| / max |logit| = {error:.2e}"


def test_loading_the_checkpoint_in_one_process_raises_no_distributed_warning(step_folder, export_run):
    model = build_model(parse_job_config(JOB), torch.device("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_weights(model, step_folder)
    assert not [w for w in caught if "torch.distributed" in str(w.message)]
    assert "torch.distributed" not in export_run[1].stderr, export_run[1].stderr


def test_transformers_computes_the_checkpoints_dense_logits(step_folder, exported):
    model = build_model(parse_job_config(JOB), torch.device("cpu"))
    load_weights(model, step_folder)
    assert_same_logits(model, exported)


def test_the_conversion_is_exact_on_weights_that_make_attention_depend_on_position(tmp_path):
    """Fresh N(0, 0.2^2) weights make attention sharp, so RoPE (theta, llama3 scaling, q/k layout) shows in logits."""
    job_config, model = sharp_random_model(JOB)
    export(model, job_config, tmp_path, record={})
    assert_same_logits(model, tmp_path)


def test_the_export_follows_the_runs_record_not_the_config_file(exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["max_position_embeddings"] == SEQ_LEN


def test_a_document_longer_than_the_model_tokenizes_without_a_length_warning(tmp_path):
    """lm-eval tokenizes whole documents, then cuts windows of config.json's max_position_embeddings: the
    tokenizer has no limit of its own to warn about."""
    job_config, model = sharp_random_model(JOB)
    export(model, job_config, tmp_path, record={})
    text = "".join(random.choice("ab ü\n") for _ in range(random.randrange(SEQ_LEN + 1, 3 * SEQ_LEN)))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    with transformers_warnings() as messages:
        assert len(tokenizer(text)["input_ids"]) > SEQ_LEN
    assert messages == []


def test_a_config_file_that_disagrees_with_the_record_is_refused(step_folder, tmp_path, capsys):
    line = refused(capsys, str(step_folder), str(tmp_path / "out"), "--job.config_file", "configs/debug.toml")
    assert f"training.seq_len=512 (record: {SEQ_LEN})" in line and "drop --job.config_file" in line
    assert not (tmp_path / "out").exists()


def test_the_export_records_its_source_and_how_it_was_trained(step_folder, exported):
    record = json.loads((exported / RECORD_FILE).read_text())
    assert record["checkpoint"] == str(step_folder) and record["step"] == STEPS
    assert record["commit"] == source_commit(REPO)
    (run_record,) = (step_folder.parents[1] / "runs").iterdir()
    assert record["run_record"] == str(run_record)
    assert record["attention"] == "dense" and record["stage1"] is False
    assert record["trained"].startswith("dense from step 2, after lighthouse L3")
    assert record["job_config"]["model"]["flavor"] == "debug"
    assert record["job_config"]["training"]["seq_len"] == SEQ_LEN
    assert record["seq_len"] == {"exported": SEQ_LEN, "trained": SEQ_LEN}


def test_a_length_override_is_recorded_beside_the_trained_length(step_folder, tmp_path):
    export_main([str(step_folder), str(tmp_path), "--training.seq_len", str(4 * SEQ_LEN)])
    assert json.loads((tmp_path / "config.json").read_text())["max_position_embeddings"] == 4 * SEQ_LEN
    assert json.loads((tmp_path / RECORD_FILE).read_text())["seq_len"] == {"exported": 4 * SEQ_LEN,
                                                                           "trained": SEQ_LEN}


def test_a_stage1_checkpoint_is_refused_unless_allowed(checkpoints, tmp_path, capsys):
    line = refused(capsys, str(checkpoints / "step-1"), str(tmp_path))
    assert "trained with Lighthouse (lighthouse L3" in line and "--allow-stage1" in line
    assert not any(tmp_path.iterdir())

    export_main([str(checkpoints / "step-1"), str(tmp_path), "--allow-stage1"])
    assert "(stage 1: trained with Lighthouse)" in capsys.readouterr().out
    record = json.loads((tmp_path / RECORD_FILE).read_text())
    assert record["stage1"] is True and record["trained"].startswith("lighthouse L3")


def test_a_stage1_checkpoint_is_refused_from_its_run_record_before_torch_or_torchtitan_is_imported(checkpoints,
                                                                                                   tmp_path):
    run = run_without_torch("scripts/export_hf.py", [str(checkpoints / "step-1"), str(tmp_path)])
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr[-3000:]
    assert "trained with Lighthouse (lighthouse L3" in run.stderr and "--allow-stage1" in run.stderr


def test_a_checkpoint_without_its_run_record_needs_the_config_file(step_folder, tmp_path, capsys):
    copy = tmp_path / "copied" / f"step-{STEPS}"
    shutil.copytree(step_folder, copy)
    line = refused(capsys, str(copy), str(tmp_path / "out"))
    assert "has no run record" in line and "--job.config_file" in line

    export_main([str(copy), str(tmp_path / "out"), *RUN_JOB])
    record = json.loads((tmp_path / "out" / RECORD_FILE).read_text())
    assert record["run_record"] is None and record["job_config"]["training"]["seq_len"] == SEQ_LEN


@contextlib.contextmanager
def transformers_warnings() -> Iterator[list[str]]:
    """The messages transformers logs at warning level or above inside the block."""
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(handler)
    try:
        yield messages
    finally:
        transformers_logger.removeHandler(handler)


def test_the_folder_loads_without_warnings(exported):
    """No RoPE complaint (original_max_position_embeddings must stay below max_position_embeddings), nothing else."""
    with transformers_warnings() as messages:
        config = json.loads((exported / "config.json").read_text())["rope_scaling"]
        assert config["original_max_position_embeddings"] < SEQ_LEN
        AutoTokenizer.from_pretrained(exported)
        AutoModelForCausalLM.from_pretrained(exported)
    assert messages == []


def test_the_weights_are_readable_as_the_umask_allows(exported):
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((exported / WEIGHTS_FILE).stat().st_mode) == 0o666 & ~umask


def test_autotokenizer_encodes_and_decodes_as_the_byte_tokenizer(exported):
    tokenizer, recipe_tokenizer = AutoTokenizer.from_pretrained(exported), ByteTokenizer()
    bos, eos = recipe_tokenizer.bos_id, recipe_tokenizer.eos_id
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (bos, eos, eos)
    ids = tokenizer(TEXT).input_ids
    assert ids == recipe_tokenizer.encode(TEXT, add_bos=False, add_eos=False)
    document_start = AutoTokenizer.from_pretrained(exported, add_bos_token=True)
    assert document_start(TEXT).input_ids == recipe_tokenizer.encode(TEXT, add_bos=True, add_eos=False)
    assert tokenizer.decode([bos, *ids, eos], skip_special_tokens=True) == TEXT
    # Every byte, also those no UTF-8 text holds (0xC0, 0xC1, 0xF5..0xFF): the same U+FFFD replacements.
    every_byte = [bos, *range(NUM_BYTES), eos]
    assert tokenizer.decode(every_byte, skip_special_tokens=True) == recipe_tokenizer.decode(every_byte)


def test_batches_pad_on_the_left_and_generate_as_each_text_alone(exported):
    tokenizer = AutoTokenizer.from_pretrained(exported)
    model = AutoModelForCausalLM.from_pretrained(exported).eval()
    texts = ["a", "bb", "Grüße"]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    assert sorted(batch) == ["attention_mask", "input_ids"]
    lengths = [len(text.encode()) for text in texts]
    assert batch.attention_mask.sum(dim=1).tolist() == lengths
    assert (batch.input_ids[0, :max(lengths) - lengths[0]] == EOS_ID).all()  # padding on the left
    greedy = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False}  # no early EOS: equal lengths
    generated = model.generate(**batch, **greedy)[:, batch.input_ids.shape[1]:]
    for text, row in zip(texts, generated):
        alone = tokenizer([text], return_tensors="pt")
        assert row.tolist() == model.generate(**alone, **greedy)[0, alone.input_ids.shape[1]:].tolist()
    outputs = pipeline("text-generation", model=model, tokenizer=tokenizer, batch_size=len(texts))(texts, **greedy)
    assert [output[0]["generated_text"] for output in outputs] == [
        text + tokenizer.decode(row, skip_special_tokens=True) for text, row in zip(texts, generated)]


def test_the_pipeline_decodes_greedily_as_generate_does_unless_asked_to_sample(exported):
    tokenizer = AutoTokenizer.from_pretrained(exported)
    model = AutoModelForCausalLM.from_pretrained(exported).eval()
    assert json.loads((exported / "generation_config.json").read_text())["do_sample"] is False
    length = {"max_new_tokens": 16, "min_new_tokens": 16}
    prompt = tokenizer(["Gr"], return_tensors="pt")
    greedy = model.generate(**prompt, **length)[0, prompt.input_ids.shape[1]:]
    generated = pipeline("text-generation", model=model, tokenizer=tokenizer)("Gr", **length)
    assert generated[0]["generated_text"] == "Gr" + tokenizer.decode(greedy, skip_special_tokens=True)


def test_a_folder_that_is_not_a_checkpoint_is_rejected(tmp_path, capsys):
    line = refused(capsys, str(tmp_path), str(tmp_path / "out"), *JOB)
    assert "is not a DCP checkpoint folder" in line
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_no_checkpoint_is_refused_before_torch_is_imported(tmp_path):
    code = ("import runpy, sys\n"
            f"sys.argv = ['scripts/export_hf.py', {str(tmp_path)!r}, {str(tmp_path / 'out')!r}]\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as end:\n"
            "    print(end.code, 'torch' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(), capture_output=True, text=True,
                         timeout=60)
    assert (run.stdout, run.stderr) == ("2 False\n", f"export_hf.py: error: {tmp_path} is not a DCP checkpoint "
                                        "folder (no .metadata); expected <dump_folder>/<checkpoint.folder>/step-<N>\n")


def test_a_non_empty_out_is_refused_unless_forced(step_folder, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep")
    line = refused(capsys, str(step_folder), str(tmp_path))
    assert str(tmp_path) in line and "--force" in line
    assert not (tmp_path / "config.json").exists()

    export_main([str(step_folder), str(tmp_path), "--force"])
    assert (tmp_path / "config.json").is_file() and (tmp_path / "notes.txt").read_text() == "keep"
