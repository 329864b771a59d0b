"""Your tokenizer, your data, your weights, on CPU with nothing downloaded: a byte-level BPE trained here on a few
KB of text, a randomly initialised transformers `LlamaForCausalLM` saved with it as a Hugging Face folder, then
import -> one dense step -> resume with a Lighthouse step and a dense step -> export -> transformers, whose logits
and held-out bits per byte are the recipe's.

One run (`trained`) serves every assertion; the refusals only run the trainer's start-up checks.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from eval.checkpoint import build_model, load_weights, logits_function, parse_job_config
from eval.metrics.heldout import document_loss, heldout_windows
from recipe.data.bpe import train_bpe
from recipe.data.loader import synthetic_document
from recipe.data.tokenizer import BOS_ID, EOS_ID, VOCAB_MULTIPLE, build_tokenizer
from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.train.cli import ConfigError, parse_job_config as parse_train_args
from recipe.train.hf_at_once import check_hf_shape_at_once
from recipe.train.trainer import check_job, check_start_up

from .helpers import fresh_seed, run_without_torch, script_exit_code, train_in_one_process

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN, BPE_VOCAB = 128, 400
VOCAB = -(-BPE_VOCAB // VOCAB_MULTIPLE) * VOCAB_MULTIPLE  # 448: the tokenizer's, padded
ROPE = ["--rope.theta", "10000", "--rope.scaling_factor", "1"]  # the folder's: rope_theta 10000, no rope_scaling
RELATIVE_TOLERANCE = 1e-5


def script(name: str):
    """`scripts/<name>.py`'s main, run in this process."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    """Training text (.txt files), held-out documents (.jsonl), and a Hugging Face Llama folder: a BPE trained
    on the training text and a random LlamaForCausalLM of the debug flavor's shape, with fresh seeds."""
    root, seed = tmp_path_factory.mktemp("byo"), fresh_seed()
    rng = random.Random(seed)
    train = root / "train"
    train.mkdir()
    texts = [synthetic_document(seed, i, rng.randint(2000, 4000)) for i in range(6)]
    for i, text in enumerate(texts):
        (train / f"doc{i}.txt").write_text(text)
    heldout = root / "heldout"
    heldout.mkdir()
    # At most SEQ_LEN ASCII bytes each, so one window holds a document and its BOS whatever the BPE makes of it (a
    # token covers at least one byte; at 80-200 characters a fresh document could take more than SEQ_LEN tokens).
    documents = [synthetic_document(seed + 1, i, rng.randint(80, 200))[:SEQ_LEN] for i in range(3)]
    (heldout / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    hf = train_bpe(texts, BPE_VOCAB, root / "hf")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=SEQ_LEN, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                         initializer_range=0.2)  # sharp enough that attention depends on position (RoPE shows)
    LlamaForCausalLM(config).save_pretrained(hf, safe_serialization=True)
    return {"root": root, "train": train, "heldout": heldout, "hf": hf}


def job(assets, dump: str, *extra: str) -> list[str]:
    """train.py's arguments for the debug flavor on the training text with the folder's tokenizer and RoPE."""
    return ["--job.config_file", str(REPO / "configs/debug.toml"), "--model.hf_assets_path", str(assets["hf"]),
            "--training.dataset", "local", "--training.dataset_path", str(assets["train"]),
            "--training.seq_len", str(SEQ_LEN), "--job.dump_folder", str(assets["root"] / dump),
            "--checkpoint.interval", "1", "--lr_scheduler.warmup_steps", "1", *ROPE, *extra]


IMPORT = ["--checkpoint.initial_load_path", "{hf}", "--checkpoint.initial_load_in_hf",
          "--checkpoint.initial_load_model_only"]


def importing(assets) -> list[str]:
    return [arg.format(hf=assets["hf"]) for arg in IMPORT]


@pytest.fixture(scope="module")
def trained(assets) -> Path:
    """The dump folder of: import, step 1 dense; then a resume with step 2 Lighthouse and step 3 dense."""
    stage0 = job(assets, "run", *importing(assets), "--lighthouse.no-enable", "--training.steps", "1")
    resumed = job(assets, "run", "--training.steps", "3", "--lighthouse.switch_to_dense_at_step", "2")
    out = train_in_one_process([stage0, resumed])
    assert out.returncode == 0, out.stderr[-4000:]
    return assets["root"] / "run"


def test_the_model_takes_the_tokenizers_vocabulary_padded_and_its_bos_eos(assets):
    config = parse_train_args(job(assets, "unused"))
    tokenizer = build_tokenizer(config)
    assert (tokenizer.get_vocab_size(), tokenizer.bos_id, tokenizer.eos_id) == (BPE_VOCAB, 0, 1)
    model = build_model(config, torch.device("cpu"))
    assert model.tok_embeddings.weight.shape[0] == model.output.weight.shape[0] == VOCAB
    assert model.model_args.eos_id == 1


def test_the_import_loads_the_hugging_face_weights(assets, trained):
    """Step 1's loss, taken before its update on the imported weights, is transformers' loss on the same window."""
    tokenizer = build_tokenizer(parse_train_args(job(assets, "unused")))
    stream = [t for f in sorted(assets["train"].iterdir()) for t in tokenizer.encode(f.read_text(), add_bos=True,
                                                                                         add_eos=True)]
    window = torch.tensor(stream[: 2 * (SEQ_LEN + 1)]).view(2, SEQ_LEN + 1)  # the first batch (local_batch_size 2)
    hf_model = AutoModelForCausalLM.from_pretrained(assets["hf"]).eval()
    with torch.no_grad():
        logits = hf_model(window[:, :-1]).logits
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten()).item()
    first = read_metrics(str(trained / METRICS_FILE))[0]
    assert first["step"] == 1 and first["loss_metrics/global_avg_loss"] == pytest.approx(expected, rel=1e-5)


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "model"
    script("export_hf")([str(trained / "checkpoint" / "step-3"), str(out)])
    return out


def test_the_export_computes_the_recipes_logits_with_the_same_tokenizer(assets, trained, exported):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (exported / name).read_bytes() == (assets["hf"] / name).read_bytes()
    job_config = parse_job_config(job(assets, "run"))
    model = build_model(job_config, torch.device("cpu"))
    load_weights(model, trained / "checkpoint" / "step-3")
    model.set_lighthouse_enabled(False)
    hf_model = AutoModelForCausalLM.from_pretrained(exported).eval()
    ids = torch.randint(0, BPE_VOCAB, (2, SEQ_LEN))
    with torch.no_grad():
        expected, actual = model(ids), hf_model(ids).logits
    assert (actual - expected).abs().max() / expected.abs().max() < RELATIVE_TOLERANCE
    text = (assets["heldout"] / "docs.jsonl").read_text()[:100]
    assert AutoTokenizer.from_pretrained(exported)(text).input_ids == build_tokenizer(job_config).encode(
        text, add_bos=False, add_eos=False)


def test_heldout_bits_per_byte_are_the_exported_models(assets, trained, exported, tmp_path, capsys):
    record = script("heldout_loss")(["--checkpoint", str(trained / "checkpoint" / "step-3"), "--data",
                                     str(assets["heldout"]), "--documents", "3", "--out", str(tmp_path / "heldout"),
                                     "--no-progress", *job(assets, "run")])
    tokenizer = AutoTokenizer.from_pretrained(exported)
    hf_model = AutoModelForCausalLM.from_pretrained(exported).eval()
    nats, count = 0.0, 0
    for line in (assets["heldout"] / "docs.jsonl").read_text().splitlines():
        document = json.loads(line)["text"]
        ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(document).input_ids]])
        assert ids.shape[1] <= SEQ_LEN + 1  # one window: no rolling
        with torch.no_grad():
            logits = hf_model(ids[:, :-1]).logits[0]
        nats += torch.nn.functional.cross_entropy(logits.double(), ids[0, 1:], reduction="sum").item()
        count += len(document.encode("utf-8"))
    assert record["bytes"] == count
    assert record["bits_per_byte"] == pytest.approx(nats / count / math.log(2), rel=RELATIVE_TOLERANCE)
    assert (f"held-out loss, dense: {record['loss']['dense']:.4f} nats/byte, {record['bits_per_byte']:.4f} bits/byte"
            in capsys.readouterr().out)


@pytest.mark.slow  # lm_eval starts in its own process and loads the model (about a minute)
def test_lm_evals_rolling_score_of_the_bpe_export_is_the_recipes_per_document_loss(assets, trained, exported,
                                                                                     tmp_path):
    """lm-eval's documented command on the local task lighthouse_docs: each document's rolling log-likelihood is
    eval.metrics.heldout.document_loss with the job's BPE (its tokens after BOS, windows of the training length)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf_home")}
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={exported}",
               "--include_path", str(REPO / "eval" / "metrics" / "lm_eval_tasks"), "--tasks", "lighthouse_docs",
               "--device", "cpu", "--batch_size", "4", "--output_path", str(tmp_path), "--log_samples"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    (path,) = tmp_path.rglob("samples_lighthouse_docs_*.jsonl")
    job_config = parse_job_config(job(assets, "run"))
    model = build_model(job_config, torch.device("cpu"))
    load_weights(model, trained / "checkpoint" / "step-3")
    model.set_lighthouse_enabled(False)
    logits_fn, tokenizer = logits_function(model, job_config, torch.device("cpu")), build_tokenizer(job_config)
    for sample in map(json.loads, path.read_text().splitlines()):
        text = sample["doc"]["text"]
        nats, count = document_loss(logits_fn, [text], SEQ_LEN, tokenizer=tokenizer)
        (actual,) = sample["filtered_resps"]
        assert count == len(text.encode("utf-8")) and float(actual) == pytest.approx(-nats * count, abs=1e-3), text


VALIDATION_STEPS, VALIDATION_BATCH = 2, 2


def validating(assets, dump: str, tokenizer: str) -> list[str]:
    """One step of `tokenizer` ("bpe": the folder's, "byte": `.`), validated on the training text's first windows."""
    argv = job(assets, dump, "--training.steps", "1", "--validation.enable", "--validation.dataset", "local",
               "--validation.dataset_path", str(assets["train"]), "--validation.steps", str(VALIDATION_STEPS),
               "--validation.local_batch_size", str(VALIDATION_BATCH), "--validation.seq_len", str(SEQ_LEN))
    if tokenizer == "byte":
        argv[argv.index("--model.hf_assets_path") + 1] = "."
    return argv


@pytest.fixture(scope="module")
def validated(assets) -> dict[str, list[str]]:
    """The arguments of a byte run and of a BPE run, each trained one step and validated after it."""
    argvs = {name: validating(assets, f"validated-{name}", name) for name in ("byte", "bpe")}
    out = train_in_one_process(list(argvs.values()))
    assert out.returncode == 0, out.stderr[-4000:]
    return argvs


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_validation_reports_bits_per_byte_of_the_windows_target_text(assets, validated, tokenizer):
    """bits per byte x ln 2 x the bytes of the windows' target text = per-token loss x their target tokens: for
    the byte tokenizer, bits per byte is the loss over ln 2 scaled by the share of targets that are not BOS/EOS."""
    argv = validated[tokenizer]
    tok = build_tokenizer(parse_train_args(argv))
    targets = heldout_windows(str(assets["train"]), SEQ_LEN, VALIDATION_STEPS * VALIDATION_BATCH,
                              tokenizer=tok)[:, 1:].flatten()
    text = tok.decode([t for t in targets.tolist() if t not in (tok.bos_id, tok.eos_id)])
    text_bytes = len(text.encode("utf-8"))
    if tokenizer == "byte":
        assert text_bytes == targets.numel() - torch.isin(targets, torch.tensor([BOS_ID, EOS_ID])).sum()
    (record,) = [r for r in read_metrics(argv[argv.index("--job.dump_folder") + 1] + f"/{METRICS_FILE}")
                 if "validation_metrics/loss" in r]
    for attention in ("lighthouse", "dense"):
        loss, bits = record[f"validation/{attention}_loss"], record[f"validation/{attention}_bits_per_byte"]
        assert bits * math.log(2) * text_bytes == pytest.approx(loss * targets.numel(), rel=1e-6)


def test_a_resumed_bpe_run_sees_the_batches_of_an_uninterrupted_one(assets):
    """Steps 1-3 in one run and as 2 + a resume for 1 more (one LR schedule of 3 steps): the same losses bit for bit
    (the data position of a BPE stream, its partial window included, is in the checkpoint)."""
    schedule = ["--lr_scheduler.total_steps", "3"]
    straight = job(assets, "straight", "--training.steps", "3", *schedule)
    first, resumed = (job(assets, "resumed", "--training.steps", str(steps), *schedule) for steps in (2, 3))
    out = train_in_one_process([straight, first, resumed])
    assert out.returncode == 0, out.stderr[-4000:]
    losses = {name: {r["step"]: r["loss_metrics/global_avg_loss"] for r in read_metrics(
        str(assets["root"] / name / METRICS_FILE)) if "loss_metrics/global_avg_loss" in r}
        for name in ("straight", "resumed")}
    assert sorted(losses["straight"]) == [1, 2, 3]
    assert losses["resumed"] == losses["straight"]


def test_last_save_in_hf_writes_a_folder_that_transformers_loads_with_the_recipes_logits(assets):
    """Import, then two steps at lr 0: step 1 a full checkpoint, step 2 `last_save_in_hf`, whose folder (torchtitan's
    safetensors, the recipe's config.json and tokenizer files) gives the logits of step 1's weights in the recipe."""
    argv = job(assets, "in_hf", *importing(assets), "--training.steps", "2", "--optimizer.lr", "0",
               "--lighthouse.no-enable", "--checkpoint.last_save_model_only", "--checkpoint.last_save_in_hf")
    out = train_in_one_process([argv])
    assert out.returncode == 0, out.stderr[-4000:]
    folder = assets["root"] / "in_hf" / "checkpoint" / "step-2"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (assets["hf"] / name).read_bytes()
    job_config = parse_job_config(argv)
    model = build_model(job_config, torch.device("cpu"))
    load_weights(model, folder.parent / "step-1")
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(0, BPE_VOCAB, (2, SEQ_LEN))
    with torch.no_grad():
        expected, actual = model(ids), hf_model(ids).logits
    assert (actual - expected).abs().max() / expected.abs().max() < RELATIVE_TOLERANCE
    text = (assets["heldout"] / "docs.jsonl").read_text()[:100]
    assert AutoTokenizer.from_pretrained(folder)(text).input_ids == build_tokenizer(job_config).encode(
        text, add_bos=False, add_eos=False)


def refusal(assets, *argv: str) -> str:
    """The one line the trainer's start-up checks give for `argv`."""
    with pytest.raises(ConfigError) as error:
        check_start_up(parse_train_args(list(argv)))
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_flavor_of_another_shape_is_refused_in_one_line(assets):
    line = refusal(assets, *job(assets, "other", *importing(assets), "--model.flavor", "tiny"))
    assert "hidden_size=128 (the job: 256)" in line and "num_hidden_layers=4 (the job: 8)" in line


def test_a_flavor_of_another_shape_is_refused_before_torch_or_torchtitan_is_imported(assets):
    argv = job(assets, "other", *importing(assets), "--model.flavor", "tiny")
    with pytest.raises(ConfigError) as early:
        check_hf_shape_at_once(argv)
    full = refusal(assets, *argv)
    differences = ("hidden_size=128 (the job: 256)", "num_hidden_layers=4 (the job: 8)")
    assert (all(d in str(early.value) for d in differences)
            and str(early.value).split(" has ")[0] == full.split(" has ")[0])
    run = run_without_torch("train.py", argv)
    assert run.returncode == 2 and run.stderr.strip() == f"error: {early.value}", run.stderr[-3000:]


@pytest.mark.parametrize("case", ["the flavor's shape", "flavor hf", "checkpointing off", "its own checkpoint",
                                  "no import"])
def test_the_early_shape_check_passes_what_the_full_check_decides(assets, tmp_path, case):
    flavor = {"the flavor's shape": "debug", "flavor hf": "hf"}.get(case, "tiny")
    extra = {"checkpointing off": ["--checkpoint.no-enable"]}.get(case, [])
    argv = job(assets, "other", *([] if case == "no import" else importing(assets)), "--model.flavor", flavor,
               "--job.dump_folder", str(tmp_path), *extra)
    if case == "its own checkpoint":
        (tmp_path / "checkpoint").mkdir()
    check_hf_shape_at_once(argv)


def test_another_rope_is_refused_with_the_flags_that_carry_it(assets):
    argv = job(assets, "other", *importing(assets))
    at = argv.index(ROPE[0])
    del argv[at:at + len(ROPE)]
    line = refusal(assets, *argv)
    assert "rope_theta=10000.0 (the job: 500000.0)" in line and "--rope.theta 10000.0 --rope.scaling_factor 1.0" in line
    check_start_up(parse_train_args([*argv, "--rope.change_imported"]))  # context extension on purpose


def rewritten_hf_folder(assets, tmp_path: Path, change) -> Path:
    """A copy of the Hugging Face folder whose weights are `change(tensors)`."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hf"
    shutil.copytree(assets["hf"], folder)
    (weights,) = folder.glob("*.safetensors")
    tensors = load_file(weights)
    change(tensors)
    save_file(tensors, weights, metadata={"format": "pt"})
    return folder


def test_integer_weights_or_a_tensor_the_model_has_no_place_for_are_refused_in_one_line(assets, tmp_path):
    """DCP would load int32 tensors as values (a loss in the tens of thousands) and drop a 10th layer's weights
    without a word."""
    def to_int32(tensors):
        tensors["model.layers.2.self_attn.k_proj.weight"] = tensors["model.layers.2.self_attn.k_proj.weight"].int()

    def extra_layer(tensors):
        tensors["model.layers.9.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"].clone()

    for change, message in ((to_int32, "stores model.layers.2.self_attn.k_proj.weight as I32 (1 tensor(s) not in a "
                                       "floating-point dtype"),
                            (extra_layer, "the folder holds model.layers.9.mlp.up_proj.weight, which "
                                          "model.flavor='debug' has no parameter for")):
        folder = rewritten_hf_folder(assets, tmp_path / change.__name__, change)
        argv = [arg.replace(str(assets["hf"]), str(folder)) for arg in job(assets, "other", *importing(assets))]
        assert message in refusal(assets, *argv)


def test_heldout_loss_names_the_tokenizer_a_checkpoint_was_trained_with(assets, trained, tmp_path):
    """Scored with the byte tokenizer, the BPE run's checkpoint would fail its load with a page of size mismatches."""
    with pytest.raises(ConfigError, match=r"^model.hf_assets_path='.' gives the byte tokenizer, but .*step-3 was "
                                          r"trained with a 400-entry Hugging Face tokenizer \(tokenizer.json sha256 "):
        script("heldout_loss")(["--checkpoint", str(trained / "checkpoint" / "step-3"), "--data",
                                str(assets["heldout"]), "--out", str(tmp_path / "heldout"), "--no-progress",
                                *job(assets, "run"), "--model.hf_assets_path", "."])


def test_a_resume_with_another_tokenizer_of_the_same_size_is_refused(assets, trained, tmp_path):
    other = train_bpe([synthetic_document(fresh_seed(), i, 3000) for i in range(6)], BPE_VOCAB, tmp_path / "tok")
    argv = job(assets, "run", "--training.steps", "4")
    argv[argv.index("--model.hf_assets_path") + 1] = str(other)
    assert "were trained with hf:400:" in refusal(assets, *argv)


@pytest.mark.parametrize("entries", [320, 1024])
def test_an_exact_bpe_has_that_many_entries_and_the_model_that_vocabulary(entries, tmp_path):
    """`train_bpe(exact=True)`, which the throughput script's --vocab-size uses: reserved tokens fill what the text's
    merges leave, so a model of a multiple of 64 entries has exactly that vocabulary."""
    texts = [synthetic_document(fresh_seed(), 0, 500)]
    folder = train_bpe(texts, entries, tmp_path / "bpe", exact=True)
    config = parse_train_args(["--job.config_file", str(REPO / "configs/debug.toml"),
                               "--model.hf_assets_path", str(folder)])
    assert build_tokenizer(config).get_vocab_size() == entries
    assert build_model(config, torch.device("meta")).output.weight.shape[0] == entries


def test_make_tokenizer_trains_a_bpe_on_your_text_that_the_job_then_uses(assets, tmp_path):
    out = script("make_tokenizer")(["--data", str(assets["train"]), "--vocab-size", "300", "--out",
                                    str(tmp_path / "tok")])
    config = parse_train_args(["--job.config_file", str(REPO / "configs/debug.toml"), "--model.hf_assets_path",
                               str(out)])
    tokenizer = build_tokenizer(config)
    assert tokenizer.get_vocab_size() <= 300 and tokenizer.bos_id is not None and tokenizer.eos_id is not None
    text = (assets["train"] / "doc0.txt").read_text()
    assert tokenizer.decode(tokenizer.encode(text, add_bos=False, add_eos=False)) == text


def test_make_tokenizer_with_max_bytes_learns_only_from_the_documents_up_to_that_many_bytes_and_says_so(
        tmp_path, capsys):
    rng = random.Random(fresh_seed())
    data = tmp_path / "data"
    data.mkdir()
    for name, letters in (("a.txt", "abcd"), ("b.txt", "wxyz")):  # disjoint letters: b's merges betray its reading
        words = ("".join(rng.choices(letters, k=rng.randint(2, 6))) for _ in range(800))
        (data / name).write_text(" ".join(words))
    first = len((data / "a.txt").read_bytes())
    out = script("make_tokenizer")(["--data", str(data), "--vocab-size", "400", "--out", str(tmp_path / "tok"),
                                    "--max-bytes", str(first)])
    said = capsys.readouterr().out
    assert f"trained on 1 documents ({first:,} bytes); --max-bytes {first:,} reached" in said
    saved = json.loads((out / "tokenizer.json").read_text())
    special = {added["content"] for added in saved["added_tokens"]}  # BOS and EOS, not learned
    merged = [token for token in saved["model"]["vocab"] if len(token) > 1 and token not in special]
    assert any(set(token) <= set("abcd") for token in merged)
    assert not any(set(token) & set("wxyz") for token in merged)


def test_make_tokenizer_refuses_a_max_bytes_below_1_in_one_line(tmp_path, monkeypatch, capsys):
    code = script_exit_code("make_tokenizer.py", ["--data", str(tmp_path), "--vocab-size", "400", "--out",
                                                  str(tmp_path / "tok"), "--max-bytes", "0"], monkeypatch)
    assert code == 2
    assert "--max-bytes 0 must be at least 1" in capsys.readouterr().err


def test_the_context_extension_configs_chain_stage_0_to_1_to_2_with_one_long_rope():
    stages = [parse_train_args(["--job.config_file", str(REPO / f"configs/extend/{name}.toml")])
              for name in ("stage0_short", "stage1_lighthouse_long", "stage2_dense_long")]
    for stage in stages:
        check_job(stage)
    short, long, dense = stages
    assert not short.lighthouse.enable and long.lighthouse.enable and not dense.lighthouse.enable
    assert long.training.seq_len == dense.training.seq_len > short.training.seq_len
    assert long.rope.theta == dense.rope.theta != short.rope.theta
    # each stage names the previous stage's checkpoint folder, whose newest complete step it starts from
    assert long.checkpoint.initial_load_path == f"{short.job.dump_folder}/{short.checkpoint.folder}"
    assert dense.checkpoint.initial_load_path == f"{long.job.dump_folder}/{long.checkpoint.folder}"
    assert long.checkpoint.initial_load_model_only and not dense.checkpoint.initial_load_model_only
    assert not long.checkpoint.last_save_model_only  # stage 2 resumes stage 1's optimizer, schedule and data
