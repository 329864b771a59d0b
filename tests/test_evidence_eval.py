"""scripts/niah.py, scripts/heldout_loss.py, scripts/causality_audit.py and scripts/generate.py on a tiny checkpoint
written by a short
training run on CPU.

The run: train.py (on CPU the Lighthouse call is the reference), the debug flavor at sequence 256, three steps on a byte
corpus of this repository's own sources.
"""
from __future__ import annotations

import json
import math
import random
import re
import runpy
import subprocess
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from eval.checkpoint import build_model, load_weights, parse_job_config
from eval.metrics.causality import ROW_KEYS
from eval.metrics.heldout import document_loss, heldout_documents, heldout_windows
from recipe.data.loader import LocalFiles, PackedDocuments, match_local_files
from recipe.data.tokenizer import ByteTokenizer
from recipe.experiments.corpus import make_corpus

from .helpers import child_env, script_exit_code
from .warm_python import run_python

pytestmark = pytest.mark.slow  # every test trains or loads a model trained in this module

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN, STEPS = 256, 3
# Debug flavor (4 layers, 4 heads, 2 kv heads), Lighthouse L=3, p=2, k=16, m=8 in layers 1 and 2.
JOB = ["--job.config_file", "configs/replicate/small.toml", "--model.flavor", "debug",
       "--training.seq_len", str(SEQ_LEN), "--lighthouse.pool", "2", "--lighthouse.topk", "16",
       "--lighthouse.tile_budget", "8", "--lighthouse.dense_layers", "0", "3"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(corpus folder, step folder) of a 3-step Lighthouse run with a full checkpoint at its last step."""
    root = tmp_path_factory.mktemp("evidence")
    make_corpus([REPO / "lighthouse", REPO / "recipe"], root / "corpus", heldout_every=4)
    argv = [*JOB, "--job.dump_folder", str(root / "run"), "--training.steps", str(STEPS),
            "--training.local_batch_size", "2", "--training.global_batch_size", "2",
            "--training.dataset_path", str(root / "corpus" / "train" / "*.jsonl"),
            "--lr_scheduler.warmup_steps", "1", "--metrics.log_freq", "1"]
    env = child_env()
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    out = run_python(["train.py", *argv], env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return root / "corpus", root / "run" / "checkpoint" / f"step-{STEPS}"


def run_script(name: str, *argv: str) -> subprocess.CompletedProcess:
    """`python scripts/<name>.py <argv>` from the repository root, with this checkout's packages."""
    return run_python([f"scripts/{name}.py", *argv], env=child_env(), timeout=600)


def record(name: str, out: Path, *argv: str) -> dict:
    """The record scripts/<name>.py writes to `<out>.json` when run with `--out out` and `argv`; it must succeed."""
    run = run_script(name, "--out", str(out), *argv)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.with_suffix(".json").read_text())


def test_loaded_weights_are_the_checkpoints(trained, tmp_path):
    _, step = trained
    dcp_to_torch_save(str(step), str(tmp_path / "full.pt"))
    saved = torch.load(tmp_path / "full.pt", weights_only=False)
    model = build_model(parse_job_config(JOB), torch.device("cpu"))
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    load_weights(model, step)
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name]), name
        assert not torch.equal(value, fresh[name]) or "norm" in name, f"{name} was not loaded"


def test_a_folder_that_is_not_a_checkpoint_is_rejected(tmp_path):
    model = build_model(parse_job_config(JOB), torch.device("cpu"))
    with pytest.raises(ValueError, match="is not a DCP checkpoint folder"):
        load_weights(model, tmp_path)


@pytest.mark.parametrize("attention", [["--lighthouse.no-enable"], []], ids=["dense", "lighthouse"])
def test_niah_writes_the_grid_its_heatmap_and_the_setting_it_ran(trained, tmp_path, attention):
    _, step = trained
    out = tmp_path / "niah"
    niah = record("niah", out, "--checkpoint", str(step), "--lengths", "128,256", "--depths", "0,50,100", "--device",
                  "cpu", *JOB, *attention)
    assert out.with_suffix(".png").stat().st_size > 0
    assert niah["lengths"] == [128, 256] and niah["depths"] == [0, 50, 100]
    cells = [a for row in niah["accuracy"] for a in row]
    assert len(cells) == 6 and all(round(10 * a) == 10 * a and 0 <= a <= 1 for a in cells)
    assert niah["mean"] == pytest.approx(sum(cells) / 6)
    assert niah["attention"] == ("dense" if attention else "lighthouse L3 p2 k16 m8 norm paper (dense layers [0, 3])")
    assert niah["checkpoint"] == str(step) and niah["command"].startswith("niah.py --out ")


@pytest.mark.parametrize("extra, lengths, message", [
    ([], "128,98", r"--lengths=128,98: length 98 does not fit the Lighthouse setting: seq_len=98 is not divisible "
                   r"by pool\*\*\(levels-1\)=4"),
    (["--lighthouse.no-enable"], "128,512", r"--lengths=128,512: lengths \[512\] exceed training.seq_len=256"),
], ids=["lighthouse-invalid-length", "past-rope-table"])
def test_niah_rejects_lengths_the_model_cannot_run(trained, tmp_path, extra, lengths, message, monkeypatch, capsys):
    """niah.py in this process (no interpreter start): any exception but its exit fails the test as well."""
    _, step = trained
    code = script_exit_code("niah.py", ["--checkpoint", str(step), "--lengths", lengths, "--device", "cpu", "--out",
                                        str(tmp_path / "x"), *JOB, *extra], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and re.search(f"^error: {message}", err, re.M), err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


HELDOUT = ["--windows", "2", "--batch-size", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def scored(trained, tmp_path_factory) -> dict:
    """heldout_loss.py's record of two held-out windows with Lighthouse and dense attention, by position too."""
    corpus, step = trained
    return record("heldout_loss", tmp_path_factory.mktemp("heldout") / "lh", "--checkpoint", str(step), "--data",
                  str(corpus / "heldout" / "*.jsonl"), *HELDOUT, "--by-position", *JOB)


def test_heldout_loss_scores_the_same_weights_with_lighthouse_and_dense(trained, scored, tmp_path):
    corpus, step = trained
    dense = record("heldout_loss", tmp_path / "dense", "--checkpoint", str(step), "--data",
                   str(corpus / "heldout" / "*.jsonl"), *HELDOUT, *JOB, "--lighthouse.no-enable")
    assert set(scored["loss"]) == {"lighthouse", "dense"} and set(dense["loss"]) == {"dense"}
    assert scored["loss"]["dense"] == pytest.approx(dense["loss"]["dense"], rel=1e-6)
    assert scored["loss"]["lighthouse"] != scored["loss"]["dense"]  # the sparse layers compute something else
    assert 0 < dense["loss"]["dense"] < 2 * torch.log(torch.tensor(258.0)).item()


def test_heldout_loss_follows_the_run_record_and_scores_whole_documents(trained, tmp_path):
    """No --job.config_file: the model and length come from the run's record; --documents scores each document
    whole with dense attention (eval.metrics.heldout.document_loss, lm-eval's rolling score)."""
    corpus, step = trained
    data = str(corpus / "heldout" / "*.jsonl")
    losses = record("heldout_loss", tmp_path / "docs", "--checkpoint", str(step), "--data", data, "--documents", "3",
                    "--device", "cpu")
    model = build_model(parse_job_config([*JOB, "--lighthouse.no-enable"]), torch.device("cpu"))
    load_weights(model, step)
    documents = heldout_documents(data, 3)
    nats, count = document_loss(lambda ids: model(ids), documents, SEQ_LEN)
    assert losses["seq_len"] == SEQ_LEN and losses["documents"] == 3 and losses["bytes"] == count > 3 * SEQ_LEN
    assert losses["loss"] == {"dense": pytest.approx(nats, rel=1e-6)} and losses["attention"] == "dense"
    assert losses["bits_per_byte"] == pytest.approx(nats / math.log(2), rel=1e-9)


def test_loss_by_position_buckets_average_to_the_held_out_loss(scored):
    edges = scored["by_position"]["edges"]
    assert edges == [0, 64, SEQ_LEN]
    for name in ("lighthouse", "dense"):
        buckets = scored["by_position"][name]
        weighted = sum(v * (b - a) for v, a, b in zip(buckets, edges, edges[1:])) / SEQ_LEN
        assert weighted == pytest.approx(scored["loss"][name], rel=1e-5)


def test_heldout_windows_are_the_training_windows_of_those_files(trained):
    corpus, _ = trained
    pattern = str(corpus / "heldout" / "*.jsonl")
    windows = heldout_windows(pattern, 64, 3)
    packed = iter(PackedDocuments(LocalFiles(match_local_files(pattern), 0, 1), ByteTokenizer(), 64))
    for row in windows:
        inputs, labels = next(packed)
        assert torch.equal(row[:-1], inputs["input"]) and torch.equal(row[1:], labels)
    with pytest.raises(ValueError, match=r"fewer than --windows=100000"):
        heldout_windows(pattern, 64, 100000)


def test_causality_audit_records_each_lookahead_and_combines_into_the_docs_layout(trained, tmp_path):
    corpus, step = trained
    common = ["--checkpoint", str(step), "--data", str(corpus / "heldout" / "*.jsonl"), "--windows", "2",
              "--samples", "3", "--lookaheads", "1,8", "--device", "cpu"]
    dense = record("causality_audit", tmp_path / "dense", *common, *JOB, "--lighthouse.no-enable")
    causal = record("causality_audit", tmp_path / "causal", *common, *JOB, "--lighthouse.selection", "causal")
    assert (dense["selection"], causal["selection"], causal["steps"]) == ("dense", "causal", STEPS)
    assert [r["delta"] for r in dense["results"]] == [0.0, 0.0]
    assert (tmp_path / "causal.png").stat().st_size > 0
    rows = record("causality_audit", tmp_path / "docs" / "causality", "--combine", str(tmp_path / "dense.json"),
                  str(tmp_path / "causal.json"))
    assert ([(r["selection"], r["lookahead"]) for r in rows]
            == [("dense", 1), ("dense", 8), ("causal", 1), ("causal", 8)])
    assert set(ROW_KEYS) <= set(rows[0])
    assert (tmp_path / "docs" / "causality.png").stat().st_size > 0


def test_generate_samples_greedily_the_dense_models_most_likely_bytes_and_reproducibly_with_a_seed(trained, capsys):
    """scripts/generate.py in this process: temperature 0 continues the prompt with the argmax of the checkpoint's
    dense logits at every position (one forward pass over prompt + sample checks all of them); a seed repeats a
    sample, and top-k 1 is greedy."""
    _, step = trained
    generate = runpy.run_path(str(REPO / "scripts" / "generate.py"))["main"]
    prompt = random.choice(["def ", "import ", "class Light", "# "])
    common = ["--checkpoint", str(step), "--prompt", prompt, "--max-new", str(random.randrange(8, 40)), "--device",
              "cpu"]
    greedy = generate([*common, "--temperature", "0"])
    assert capsys.readouterr().out == prompt + ByteTokenizer().decode(greedy) + "\n"
    model = build_model(parse_job_config([*JOB, "--lighthouse.no-enable"]), torch.device("cpu"))
    load_weights(model, step)
    ids = ByteTokenizer().encode(prompt, add_bos=True, add_eos=False) + greedy
    with torch.no_grad():
        predicted = model(torch.tensor([ids]))[0, :-1].argmax(dim=-1).tolist()
    start = len(prompt.encode()) + 1
    assert greedy == predicted[start - 1:]  # ids, not text: a byte sample need not be valid UTF-8
    assert generate([*common, "--top-k", "1"]) == greedy
    seed = ["--seed", str(random.randrange(2**31)), "--temperature", "1.5"]
    assert generate([*common, *seed]) == generate([*common, *seed])


def test_generate_names_a_prompt_longer_than_the_models_window(trained, monkeypatch, capsys):
    _, step = trained
    code = script_exit_code("generate.py", ["--checkpoint", str(step), "--prompt", "x" * SEQ_LEN], monkeypatch)
    assert (code, capsys.readouterr().err) == (2, f"error: --prompt is {SEQ_LEN + 1} tokens with BOS, not below "
                                                  f"training.seq_len={SEQ_LEN}, the model's window\n")
