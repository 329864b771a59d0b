"""The [lighthouse] section, start-up validation, and the paper's and the long-context configuration files."""
import dataclasses
import logging
import os
import re
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from torchtitan.config import ConfigManager
import torch.distributed as dist

from models.llama3_lighthouse import FLAVORS, LighthouseLlama
from recipe.experiments import paper_configs
from recipe.train.cli import ConfigError
from recipe.train.job_config import check_initial_load
from recipe.train.trainer import LighthouseTrainer, check_job, check_start_up

from .helpers import child_env
from .warm_python import run_python

REPO = Path(__file__).resolve().parent.parent
DEBUG = str(REPO / "configs" / "debug.toml")


def parse(*args: str, config_file: str = DEBUG):
    return ConfigManager().parse_args(["--job.config_file", config_file, *args])


def test_toml_section_is_read_and_cli_overrides_it():
    config = parse("--lighthouse.topk", "64", "--lighthouse.dense_layers", "1", "3")
    section = config.lighthouse
    assert (section.levels, section.pool, section.tile_budget, section.scorer) == (3, 2, 16, "norm")
    assert section.topk == 64 and section.dense_layers == [1, 3]
    assert section.to_config().gathered_len(config.training.seq_len) == 512 // 4 + 2 * 2 * 64


def test_the_section_takes_every_layer_field_default_and_doc_from_the_layer_config():
    from lighthouse import LighthouseConfig
    from recipe.train.job_config import Lighthouse

    layer = {f.name: f.default for f in dataclasses.fields(LighthouseConfig)}
    section = {f.name: f.default for f in dataclasses.fields(Lighthouse)}
    assert {name: section[name] for name in layer} == layer
    assert set(section) - set(layer) == {"enable", "dense_layers", "dense_backend", "switch_to_dense_at_step",
                                         "dense_every", "log_stats"}
    help_text = run_python(["train.py", "--help"], env={**child_env(), "COLUMNS": "80"},  # one column of option boxes
                           timeout=300).stdout
    words = " ".join(help_text.replace("│", " ").split())
    assert "--lighthouse.levels INT Pyramid depth L (1 = plain dense causal attention). (default: 3)" in words
    assert '--lighthouse.selection STR "causal" (an entry scores the p**l tokens' in words


@pytest.mark.parametrize("args, message", [
    (["--lighthouse.topk", "40"], r"topk=40 must be a positive multiple of tile_budget=16"),
    (["--training.seq_len", "510"], r"training.seq_len=510.*pool\*\*\(levels-1\)=4"),
    (["--lighthouse.topk", "256"], r"each tile has 8 coarsest entries \(seq_len=512"),
    (["--lighthouse.scorer", "cosine"], r"scorer='cosine'"),
    (["--lighthouse.pool", "3"], r"pool=3 must be a power of two"),
    (["--lighthouse.dense_layers", "0", "4"], r"dense_layers=\[0, 4\] has \[4\] outside the model's 4 layers"),
    (["--lighthouse.dense_layers", "2", "2"], r"dense_layers=\[2, 2\] repeats \[2\]"),
    (["--lighthouse.no-enable", "--lighthouse.dense_backend", "fast"],
     r"^\[lighthouse\] dense_backend='fast' is not one of \('cudnn', 'flash_attn', 'auto'\)$"),
    (["--lighthouse.switch_to_dense_at_step", "-3"], r"switch_to_dense_at_step=-3 must be >= 0"),
    (["--lighthouse.no-enable", "--lighthouse.switch_to_dense_at_step", "5"],
     r"switch_to_dense_at_step=5 with enable=false"),
    (["--lighthouse.dense_every", "1"], r"dense_every=1 must be 0 \(never\) or >= 2"),
    (["--lighthouse.dense_every", "-4"], r"dense_every=-4 must be 0 \(never\) or >= 2"),
    (["--lighthouse.no-enable", "--lighthouse.dense_every", "4"], r"dense_every=4 with enable=false"),
    (["--validation.enable", "--validation.dataset", "synthetic", "--validation.steps", "1", "--validation.seq_len",
      "100"],
     r"validation.seq_len=100"),
    (["--model.flavor", "huge"], re.escape(f"model.flavor='huge' is not one of {sorted(FLAVORS)}")),
    (["--model.name", "llama3", "--model.flavor", "debugmodel"], r"model.name='llama3' has no Lighthouse layers"),
    (["--model.name", "llama4_lighthouse"], r"model.name='llama4_lighthouse' is not a registered model"),
    (["--training.steps", "0"], r"training.steps=0 must be >= 1"),
    (["--checkpoint.enable", "--checkpoint.initial_load_path", "/nonexistent/step-10"],
     r"checkpoint.initial_load_path='/nonexistent/step-10' is not a folder"),
], ids=["topk", "seq_len", "tile-too-small", "scorer", "pool", "dense-range", "dense-repeat", "dense-backend",
         "switch-negative",
        "switch-without-lighthouse", "dense-every-one", "dense-every-negative", "dense-every-without-lighthouse",
        "validation-seq-len", "flavor", "model-name", "model-unknown", "steps",
        "initial-load-path"])
def test_invalid_settings_fail_before_any_device_work_naming_the_values(args, message):
    config = parse(*args)
    initialized = dist.is_initialized()
    with pytest.raises(ValueError, match=message):
        LighthouseTrainer(config)
    assert dist.is_initialized() == initialized  # no process group was started


def test_host_threads_stay_free_unless_asked_and_pinning_needs_linux(monkeypatch):
    assert parse().host.colocate_autograd is False
    config = parse("--host.colocate_autograd")
    assert config.host.colocate_autograd is True
    check_job(config)
    monkeypatch.delattr(os, "sched_setaffinity")
    with pytest.raises(ConfigError, match=r"\[host\] colocate_autograd=true needs Linux"):
        check_job(config)


@pytest.mark.parametrize("args, message", [
    (["--lighthouse.topk", "40"], "[lighthouse] topk=40 must be a positive multiple of tile_budget=16"),
    (["--lighthouse.pool", "3"], "[lighthouse] pool=3 must be a power of two >= 2"),
    (["--lighthouse.levels", "0"], "[lighthouse] levels=0 must be >= 1"),
    (["--lighthouse.backend", "fast"], "[lighthouse] backend='fast' is not one of"),
    (["--lighthouse.selection", "future"], "[lighthouse] selection='future' is not one of"),
], ids=["topk", "pool", "levels", "backend", "selection"])
def test_mistakes_at_any_length_are_not_called_a_misfit_with_seq_len(args, message):
    with pytest.raises(ConfigError) as err:
        check_job(parse(*args))
    assert str(err.value).startswith(message) and "seq_len" not in str(err.value)


def test_a_length_mistake_names_the_length():
    with pytest.raises(ConfigError, match=r"^\[lighthouse\] does not fit training.seq_len=96: each tile has 12 "):
        check_job(parse("--training.seq_len", "96"))


def save_checkpoint(folder: Path, full: bool) -> str:
    """A DCP step folder with the keys of a model-only or of a full torchtitan checkpoint."""
    # the model's shape
    state = {"tok_embeddings.weight": torch.randn(FLAVORS["debug"].vocab_size, FLAVORS["debug"].dim)}
    if full:
        state["train_state"] = {"step": torch.tensor(10)}
    dcp.save(state, checkpoint_id=str(folder))
    return str(folder)


def test_a_full_resume_from_weights_only_explains_the_fix(tmp_path):
    def stage2(checkpoint: str, *extra: str):
        return parse("--checkpoint.enable", "--checkpoint.initial_load_path", checkpoint, "--job.dump_folder",
                     str(tmp_path / "stage2"), *extra)

    weights = save_checkpoint(tmp_path / "stage1" / "step-10", full=False)
    with pytest.raises(ConfigError) as err:
        LighthouseTrainer(stage2(weights, "--checkpoint.no-initial-load-model-only"))
    message = str(err.value)
    assert message.startswith(f"checkpoint.initial_load_path={weights!r} holds model weights only")
    assert "last_save_model_only = false" in message and "--checkpoint.initial_load_model_only" in message
    check_initial_load(stage2(weights, "--checkpoint.initial_load_model_only"))  # weights alone are enough
    check_initial_load(stage2(save_checkpoint(tmp_path / "full" / "step-10", full=True),
                              "--checkpoint.no-initial-load-model-only"))
    (tmp_path / "stage2" / "checkpoint").mkdir(parents=True)  # a restart resumes its own checkpoints instead
    check_initial_load(stage2(weights, "--checkpoint.no-initial-load-model-only"))


def test_a_job_without_the_config_extension_is_told_how_to_load_it(tmp_path):
    toml = Path(DEBUG).read_text().replace('custom_config_module = "recipe.train.job_config"', "")
    toml = toml[: toml.index("[lighthouse]")] + toml[toml.index("[metrics]"):]
    (tmp_path / "plain.toml").write_text(toml)
    with pytest.raises(ValueError, match=r'custom_config_module = "recipe.train.job_config"'):
        check_job(parse(config_file=str(tmp_path / "plain.toml")))


def test_paper_config_files_are_exactly_what_the_generator_renders():
    rendered = paper_configs.render_all()
    on_disk = {p.name: p.read_text() for p in paper_configs.CONFIG_DIR.glob("*.toml")}
    assert on_disk == rendered


PAPER_FILES = sorted(paper_configs.render_all())


@pytest.mark.parametrize("name", PAPER_FILES)
def test_paper_configs_parse_validate_and_carry_the_paper_settings(name):
    config = parse(config_file=str(paper_configs.CONFIG_DIR / name))
    check_job(config)
    t, o = config.training, config.optimizer
    assert (config.model.name, config.model.flavor, t.dataset, t.seq_len) == ("llama3_lighthouse", "paper", "c4", 98304)
    assert (o.name, o.lr, o.beta1, o.beta2, o.weight_decay) == ("AdamW", 2e-3, 0.9, 0.95, 0.1)
    assert (config.lr_scheduler.warmup_steps, config.lr_scheduler.total_steps, t.max_norm) == (2000, 16000, 1.0)
    assert (t.global_batch_size, t.mixed_precision_param, config.parallelism.data_parallel_shard_degree) == (
        32, "bfloat16", -1)
    assert config.checkpoint.enable and not config.checkpoint.last_save_model_only
    section = config.lighthouse
    if name.startswith("stage1_"):
        row = next(r for r in paper_configs.STAGE1_ROWS if f"{r.name}.toml" == name)
        assert section.enable and (section.levels, section.pool, section.topk, section.scorer) == (
            row.levels, row.pool, row.topk, row.scorer)
        assert section.dense_layers == [0, 1, 28, 29] and t.steps == paper_configs.STAGE1_STEPS == 8000
    else:
        assert not section.enable and t.steps == 16000
    if name == "stage2_dense.toml":
        assert config.checkpoint.initial_load_path == (
            f"./outputs/paper/{paper_configs.HEADLINE.name}/checkpoint/step-8000")
        assert not config.checkpoint.initial_load_model_only


def test_long_context_config_files_are_exactly_what_the_generator_renders():
    rendered = paper_configs.render_all_long_context()
    on_disk = {p.name: p.read_text() for p in paper_configs.LONG_CONTEXT_DIR.glob("*.toml")}
    assert on_disk == rendered


@pytest.mark.parametrize("run", paper_configs.LONG_CONTEXT_RUNS, ids=lambda run: run.name)
def test_long_context_configs_keep_the_paper_step_and_pass_the_cp_start_up_checks(run):
    config = parse(config_file=str(paper_configs.LONG_CONTEXT_DIR / f"{run.name}.toml"))
    check_job(config)
    t, section = config.training, config.lighthouse
    assert (t.seq_len, config.parallelism.context_parallel_degree) == (run.seq_len, run.cp_degree)
    assert t.seq_len * t.global_batch_size == 98304 * 32  # the paper's tokens per step
    assert (section.levels, section.pool, section.topk, section.scorer) == (3, 4, 2048, "norm")
    assert section.to_config().num_tiles % (2 * run.cp_degree) == 0  # tiles never cross a CP chunk


ONE_NODE_RUNS = [run for run in paper_configs.LONG_CONTEXT_RUNS if run.card]


def test_one_million_tokens_fit_one_node_at_cp_2_and_4_each_header_naming_its_card_and_memory():
    assert [(run.seq_len, run.cp_degree) for run in ONE_NODE_RUNS] == [(1_048_576, 2), (1_048_576, 4)]
    for run in ONE_NODE_RUNS:
        text = (paper_configs.LONG_CONTEXT_DIR / f"{run.name}.toml").read_text()
        header = text[:text.index("[job]")]
        assert f"torchrun --nproc_per_node={run.cp_degree} " in header and run.card in header
        assert parse(config_file=str(paper_configs.LONG_CONTEXT_DIR / f"{run.name}.toml")).compile.enable
    cp2, cp4 = ONE_NODE_RUNS
    assert "141 GB (H200)" in cp2.card and "80 GB (H100)" in cp4.card
    measured, docs = " ".join(cp2.measured), (REPO / "docs" / "context_parallel.md").read_text()
    assert "12,198-12,234 tok/s per GPU" in measured and "commit 945215e" in measured  # the header quotes the docs
    assert "**12,198-12,234 tok/s per GPU at steps 2-4" in docs and "at commit 945215e" in docs
    assert cp4.measured == ("Not measured yet (tok/s, peak memory).",)


# The one-node geometry (16 tiles over 2*CP chunks, 3 sequences accumulated, no FSDP) at the debug model's size.
CPU_SIZED = ("--model.flavor", "debug", "--training.seq_len", "4096", "--lighthouse.topk", "256",
             "--lighthouse.tile_budget", "16", "--lighthouse.dense_layers", "0", "3", "--training.dataset", "synthetic",
             "--compile.no-enable")


@pytest.mark.parametrize("run", ONE_NODE_RUNS, ids=lambda run: run.name)
def test_one_node_configs_pass_every_start_up_check_on_their_gpu_count_at_a_cpu_sized_override(run, tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(run.cp_degree))
    monkeypatch.setenv("MASTER_ADDR", "localhost")  # as torchrun sets it: the checks take this for a real job
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config_file = str(paper_configs.LONG_CONTEXT_DIR / f"{run.name}.toml")
    config = parse(*CPU_SIZED, "--job.dump_folder", str(tmp_path), config_file=config_file)
    check_start_up(config)
    assert config.lighthouse.to_config().num_tiles == 16 and config.training.global_batch_size == 3
    monkeypatch.setenv("WORLD_SIZE", "8")  # the header's GPU count is the only one that splits the batch of 3
    with pytest.raises(ConfigError, match=r"global_batch_size=3 is not a multiple"):
        check_start_up(parse(*CPU_SIZED, "--job.dump_folder", str(tmp_path), config_file=config_file))


@pytest.mark.slow
def test_256k_config_builds_as_cp4_times_fsdp2_on_8_fake_ranks(tmp_path):
    run = paper_configs.LONG_CONTEXT_RUNS[0]
    line, log = build_on_8_fake_ranks(f"configs/long_context/{run.name}.toml", tmp_path)
    vocab, dim = FLAVORS["paper"].vocab_size, FLAVORS["paper"].dim
    # Global batch 12 = 2 FSDP ranks x 1 sequence x 6 accumulation steps; FSDP shards over all 2 x 4 ranks.
    assert line == f"RESULT 8 4 2 6 ({vocab}, {dim}) ({-(-vocab // 8)}, {dim})"
    assert "Applied context parallel to 26 Lighthouse layers (degree 4)" in log


def test_paper_model_builds_on_meta_device_from_its_config():
    config = parse(config_file=str(paper_configs.CONFIG_DIR / f"{paper_configs.HEADLINE.name}.toml"))
    args = dataclasses.replace(FLAVORS["paper"])
    args.update_from_config(config)
    with torch.device("meta"):
        model = LighthouseLlama(args)
    on = [i for i, block in model.layers.items() if block.attention.use_lighthouse]
    assert on == [str(i) for i in range(2, 28)]
    assert model.layers["5"].attention.lighthouse == config.lighthouse.to_config()


def test_a_long_context_job_sets_the_rope_table_to_its_length_without_a_warning(caplog):
    config = parse(config_file=str(paper_configs.LONG_CONTEXT_DIR / f"{paper_configs.LONG_CONTEXT_RUNS[0].name}.toml"))
    args = dataclasses.replace(FLAVORS["paper"])
    assert config.training.seq_len > args.max_seq_len
    with caplog.at_level(logging.WARNING):
        args.update_from_config(config)
    assert args.max_seq_len == config.training.seq_len
    assert not [r for r in caplog.records if "exceeds" in r.getMessage()]


def build_on_8_fake_ranks(config_file: str, tmp_path: Path, *extra: str) -> tuple[str, str]:
    """Build the trainer for `config_file` on torchtitan's fake backend (8 ranks simulated in one process,
    model sharded on meta then materialised); (its RESULT line, the whole log)."""
    code = (
        "import recipe.compat; recipe.compat.install()\n"
        "from torchtitan.tools.logging import init_logger; init_logger()\n"
        "from torchtitan.config import ConfigManager\n"
        "from recipe.train.trainer import LighthouseTrainer\n"
        f"args = ['--job.config_file', {config_file!r}, '--comm.mode', 'fake_backend', '--training.dataset', "
        f"'synthetic', '--metrics.no-enable-tensorboard', '--job.dump_folder', {str(tmp_path)!r}, *{list(extra)!r}]\n"
        "t = LighthouseTrainer(ConfigManager().parse_args(args))\n"
        "p, dims = t.model_parts[0].tok_embeddings.weight, t.parallel_dims\n"
        "print('RESULT', dims.world_size, dims.cp, dims.dp_shard, t.gradient_accumulation_steps, tuple(p.shape), "
        "tuple(p.to_local().shape))\n"
    )
    env = {**child_env(), "NGPU": "8", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}
    out = run_python(["-c", code], env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return next(l for l in out.stdout.splitlines() if l.startswith("RESULT")), out.stdout + out.stderr


def test_paper_trainer_builds_with_fsdp_over_8_fake_ranks(tmp_path):
    line, log = build_on_8_fake_ranks(f"configs/paper/{paper_configs.HEADLINE.name}.toml", tmp_path)
    vocab, dim = FLAVORS["paper"].vocab_size, FLAVORS["paper"].dim
    # Global batch 32 = 8 ranks x 1 sequence x 4 accumulation steps; FSDP gives rank 0 ceil(258 / 8) rows.
    assert line == f"RESULT 8 1 8 4 ({vocab}, {dim}) ({-(-vocab // 8)}, {dim})"
    with torch.device("meta"):
        count = sum(p.numel() for p in LighthouseLlama(FLAVORS["paper"]).parameters())
    assert f"size: {count:,} total parameters" in log


STAGE1_OPTIONS = {"tiny_128k_dl0_switch360.toml": [0], "tiny_128k_dlnone_switch360.toml": []}


@pytest.mark.parametrize("name", sorted(STAGE1_OPTIONS))
def test_each_stage1_option_is_its_measured_arm_and_otherwise_the_defaults(name):
    """The options of docs/recipe.md ("Stage-1 options") are the price study's arms in one run: the defaults'
    tiny_128k.toml with fewer dense layers in stage 1 and dense attention from step 361."""
    folder = REPO / "configs" / "time_to_quality"
    option, defaults = parse(config_file=str(folder / name)), parse(config_file=str(folder / "tiny_128k.toml"))
    check_job(option)
    assert option.lighthouse.dense_layers == STAGE1_OPTIONS[name] and option.lighthouse.switch_to_dense_at_step == 360
    changed = {"dense_layers", "switch_to_dense_at_step"}
    for section in ("model", "training", "optimizer", "lr_scheduler", "validation", "checkpoint", "lighthouse"):
        ours, theirs = dataclasses.asdict(getattr(option, section)), dataclasses.asdict(getattr(defaults, section))
        assert {k: v for k, v in ours.items() if k not in changed} == {
            k: v for k, v in theirs.items() if k not in changed}, section
    assert defaults.lighthouse.dense_layers == [0, 7] and defaults.lighthouse.switch_to_dense_at_step == 0
