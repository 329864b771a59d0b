"""`--model.flavor hf` takes the model's shape and RoPE from config.json in `model.hf_assets_path`: a random
LlamaForCausalLM of a shape no flavor has imports with `checkpoint.initial_load_in_hf` and trains, its first loss
transformers' own, with no flavor added and no `[rope]` flags."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from eval.checkpoint import build_model
from recipe.data.bpe import train_bpe
from recipe.data.loader import synthetic_document
from recipe.data.tokenizer import VOCAB_MULTIPLE, build_tokenizer
from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.train.cli import ConfigError, parse_job_config
from recipe.train.trainer import check_start_up

from .helpers import fresh_seed, train_in_one_process

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN, BPE_VOCAB = 64, 300
VOCAB = -(-BPE_VOCAB // VOCAB_MULTIPLE) * VOCAB_MULTIPLE + VOCAB_MULTIPLE  # more entries than the tokenizer needs
# No flavor has this shape: d 96, 3 layers, 6 heads of 16, 3 kv heads, FFN 200; RoPE theta 20,000 with llama3 scaling.
SHAPE = dict(hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3)
ROPE_SCALING = {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    """Training text and a Hugging Face Llama folder: a BPE trained on the text and a random LlamaForCausalLM."""
    root, seed = tmp_path_factory.mktemp("hf_flavor"), fresh_seed()
    train = root / "train"
    train.mkdir()
    texts = [synthetic_document(seed, i, 3000) for i in range(4)]
    for i, text in enumerate(texts):
        (train / f"doc{i}.txt").write_text(text)
    hf = train_bpe(texts, BPE_VOCAB, root / "hf")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, **SHAPE, rms_norm_eps=1e-6, rope_theta=20000.0, rope_scaling=ROPE_SCALING,
                         max_position_embeddings=SEQ_LEN, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                         initializer_range=0.2)
    LlamaForCausalLM(config).save_pretrained(hf, safe_serialization=True)
    return {"root": root, "train": train, "hf": hf}


def job(assets, dump: str, *extra: str) -> list[str]:
    return ["--job.config_file", str(REPO / "configs/debug.toml"), "--model.flavor", "hf",
            "--model.hf_assets_path", str(assets["hf"]), "--training.dataset", "local",
            "--training.dataset_path", str(assets["train"]), "--training.seq_len", str(SEQ_LEN),
            "--lighthouse.no-enable", "--job.dump_folder", str(assets["root"] / dump), *extra]


def test_the_model_has_the_folders_shape_vocabulary_and_rope(assets):
    config = parse_job_config(job(assets, "unused"))
    model = build_model(config, torch.device("cpu"))
    args = model.model_args
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.vocab_size) == (96, 3, 6, 3, VOCAB)
    assert model.layers["0"].feed_forward.w1.weight.shape == (200, 96)
    assert args.rope_theta == 20000.0 and args.rope_scaling_args.scaling_factor == 2.0
    assert args.rope_scaling_args.original_max_position_embeddings == 32 and args.norm_eps == 1e-6
    assert build_tokenizer(config).get_vocab_size() == BPE_VOCAB  # the vocabulary is config.json's, not the tokenizer's


def test_a_folder_imports_and_trains_with_transformers_first_loss(assets):
    argv = job(assets, "run", "--checkpoint.initial_load_path", str(assets["hf"]), "--checkpoint.initial_load_in_hf",
               "--checkpoint.initial_load_model_only", "--training.steps", "2",
               "--metrics.log_freq", "1")
    out = train_in_one_process([argv])
    assert out.returncode == 0, out.stderr[-4000:]
    tokenizer = build_tokenizer(parse_job_config(argv))
    stream = [t for f in sorted(assets["train"].iterdir()) for t in tokenizer.encode(f.read_text(), add_bos=True,
                                                                                         add_eos=True)]
    window = torch.tensor(stream[: 2 * (SEQ_LEN + 1)]).view(2, SEQ_LEN + 1)  # the first batch (local_batch_size 2)
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(assets["hf"]).eval()(window[:, :-1]).logits
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten()).item()
    first = read_metrics(str(assets["root"] / "run" / METRICS_FILE))[0]
    assert first["step"] == 1 and first["loss_metrics/global_avg_loss"] == pytest.approx(expected, rel=1e-5)


def refusal(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as error:
        check_start_up(parse_job_config(argv))
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_folder_without_a_llama_config_is_refused_in_one_line(assets, tmp_path):
    argv = job(assets, "other")
    empty = tmp_path / "no_config"
    empty.mkdir()
    argv[argv.index("--model.hf_assets_path") + 1] = str(empty)
    assert "takes the model's shape from config.json" in refusal(argv)
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    argv[argv.index("--model.hf_assets_path") + 1] = str(other)
    assert "model_type is 'gpt2'" in refusal(argv)


def test_a_tokenizer_with_more_ids_than_the_vocabulary_is_refused(assets, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (assets["hf"] / name).exists():
            (small / name).write_bytes((assets["hf"] / name).read_bytes())
    config = json.loads((assets["hf"] / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    argv = job(assets, "other")
    argv[argv.index("--model.hf_assets_path") + 1] = str(small)
    assert "vocab_size=100" in refusal(argv)


def test_weights_of_another_shape_than_config_json_are_refused_naming_the_tensor(assets, tmp_path):
    """A config.json that does not describe its safetensors (here a wider FFN) is refused before any weight loads."""
    folder = tmp_path / "wider"
    folder.mkdir()
    for item in assets["hf"].iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))
    argv = job(assets, "other", "--checkpoint.initial_load_path", str(folder), "--checkpoint.initial_load_in_hf",
               "--checkpoint.initial_load_model_only")
    argv[argv.index("--model.hf_assets_path") + 1] = str(folder)
    line = refusal(argv)
    assert ("stores model.layers.0.mlp.down_proj.weight of shape [96, 200], where model.flavor='hf' has "
            "[96, 256]") in line
