"""The pay-off map (scripts/payoff_map.py, recipe/experiments/payoff_grid.py, eval/studies/payoff.py): a study TOML
becomes the
queue of runs that share their stage 1, mistakes name the key, and the report gives distributions over seeds."""
from __future__ import annotations

import json
import os
import random
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from torch.distributed.checkpoint import FileSystemReader

from eval.studies import payoff
from eval.studies.time_to_quality import against_earlier_dense, run_folder
from recipe.experiments.corpus import corpus_digest
from recipe.experiments.payoff_grid import (arm_first, load_study, long_first, plan_runs, scored_models,
                                           train_command)
from recipe.toml_config import dump_toml, load_toml, set_key

from .helpers import child_env, run_without_torch, script_exit_code
from .warm_python import run_python

REPO = Path(__file__).resolve().parents[1]
BASIN = REPO / "configs" / "payoff" / "tiny_128k_basin.toml"


def basin_with_seeds(tmp_path: Path, seeds: list[int]) -> Path:
    """The basin study's two blocks (the defaults with H1, then H2) on other seeds, with dense, the defaults and H2
    of seeds 2 and 3 reported (the checked-in study has every run reported, and a third block for later seeds)."""
    raw = load_toml(BASIN)
    raw["study"]["seeds"] = seeds
    raw["grid"] = [{key: value for key, value in block.items() if key != "seeds"} for block in raw["grid"][:2]]
    raw["study"]["reported"] = [n for n in raw["study"]["reported"]
                                if int(n.split("_s")[1].split("_")[0]) < 4 and "rewarm" not in n]
    path = tmp_path / "basin.toml"
    path.write_text(dump_toml(raw))
    return path


def write_study(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


STUDY = """[study]
config = "configs/time_to_quality/tiny_128k.toml"
run = "out"
corpus = "corpus"
steps = 720
seeds = [3, 4]
"""


def test_every_checked_in_study_loads_and_the_niah_study_scores_the_analysis_pairs_final_models():
    """Each study under configs/payoff plans runs, but those whose runs are all reported: the basin study (addendum
    1j) and the price of stage 1 (addendum 15). The NIAH study (addendum 1g) trains dense and the defaults of seeds
    2 and 3 again and scores exactly those final models at 8,192 and 131,072 tokens."""
    studies = {path.name: load_study(path) for path in sorted((REPO / "configs" / "payoff").glob("*.toml"))}
    assert plan_runs(studies.pop("tiny_128k_basin.toml")) == plan_runs(studies.pop("tiny_128k_stage1_price.toml")) == []
    assert all(plan_runs(study) for study in studies.values()), sorted(studies)
    niah = studies["tiny_128k_basin_niah.toml"]
    assert niah.niah_lengths == [8192, 131072] and niah.anatomy_windows > 0
    assert scored_models(niah, plan_runs(niah)) == {2: {"dense_s2": 720, "causal_s2_switch360": 720},
                                                    3: {"dense_s3": 720, "causal_s3_switch360": 720}}


def test_the_basin_study_queues_each_seeds_runs_together_and_shares_stage_1_between_switches_and_rewarms(tmp_path):
    runs = plan_runs(load_study(basin_with_seeds(tmp_path, [2, 3, 6])))
    assert [r.name for r in runs if r.seed == 6] == ["causal_s6", "dense_s6", "causal_s6_switch360",
                                                     "causal_s6_switch360_rewarm36", "causal_s6_switch180"]
    assert [r.name for r in runs if r.seed == 2] == ["causal_s2", "causal_s2_switch360_rewarm36"], \
        "reported runs (here dense, the defaults and H2) are not trained again"
    assert [r.name for r in runs][:5] == ["causal_s2", "causal_s2_switch360_rewarm36", "causal_s3",
                                          "causal_s3_switch360_rewarm36", "causal_s6"], \
        "block 1 runs seed by seed before block 2"
    stage1 = next(r for r in runs if r.name == "causal_s6")
    assert stage1.steps == 360, "stage 1 trains to the last switch any of its stage-2 runs needs"
    assert {r.after for r in runs if r.kind == "stage2" and r.seed == 6} == {("causal_s6",)}


def test_reported_runs_are_left_out_and_so_is_a_stage_1_that_nothing_left_resumes(tmp_path):
    grid = "[[grid]]\nrewarm_steps = [0, 36]\n"
    some = load_study(write_study(tmp_path, STUDY + 'reported = ["dense_s3", "causal_s3_switch360"]\n' + grid))
    assert [r.name for r in plan_runs(some) if r.seed == 3] == ["causal_s3", "causal_s3_switch360_rewarm36"]
    assert [r.name for r in plan_runs(some) if r.seed == 4] == ["causal_s4", "dense_s4", "causal_s4_switch360",
                                                                "causal_s4_switch360_rewarm36"]
    every = load_study(write_study(tmp_path, STUDY + 'reported = ["dense_s3", "causal_s3_switch360", '
                                                     '"causal_s3_switch360_rewarm36"]\n' + grid))
    assert [r.name for r in plan_runs(every) if r.seed == 3] == []


def test_time_to_quality_against_an_earlier_dense_run_of_the_seed_only_on_the_same_device():
    dense = {"name": "dense_s2", "selection": "dense", "seed": 2, "device": "4x H200",
             "curve": [[100.0, 2.6], [200.0, 2.4], [300.0, 2.3]]}
    arm = {"name": "causal_s2_switch180", "selection": "causal", "seed": 2, "device": "4x H200",
           "train_seconds": 250.0, "final_heldout_loss": 2.35}
    elsewhere = {**arm, "device": "4x H100"}
    joined, other = against_earlier_dense([arm, elsewhere], [dense])
    assert joined["dense_seconds_to_this_loss"] == pytest.approx(250.0)  # halfway between 2.4 and 2.3
    assert joined["time_to_quality_speedup"] == pytest.approx(1.0) and joined["dense_from"] == "earlier"
    assert "time_to_quality_speedup" not in other, "seconds on another card do not compare"
    here = {**dense, "name": "dense_s2", "device": "4x H200", "train_seconds": 300.0, "final_heldout_loss": 2.3}
    assert "dense_from" not in against_earlier_dense([arm, here], [dense])[0], "a dense run of its own comes first"


def test_a_stage_2_run_resumes_stage_1_at_its_switch_with_the_rewarm_it_names(tmp_path):
    study = load_study(basin_with_seeds(tmp_path, [2, 3, 4]))
    run = next(r for r in plan_runs(study) if r.name == "causal_s4_switch360_rewarm36")
    argv = shlex.split(train_command(study, run))
    value = lambda key: argv[argv.index(key) + 1]  # noqa: E731
    assert value("--checkpoint.initial_load_path") == "outputs/payoff/tiny_128k_basin/causal_s4/checkpoint/step-360"
    assert (value("--lr_scheduler.rewarm_at_step"), value("--lr_scheduler.rewarm_steps")) == ("360", "36")
    assert ((value("--debug.seed"), value("--training.steps"), value("--lr_scheduler.total_steps"))
            == ("4", "720", "720"))
    assert "--lighthouse.no-enable" in argv and "--checkpoint.no-initial-load-model-only" in argv


def test_only_stage_1_saves_its_last_step_whole_and_every_other_run_its_weights_alone(tmp_path):
    """Stage 2 resumes stage 1's last step (optimizer, schedule, data position); what reads any other run's last step
    (a fresh run from stage 0, the per-token pass) reads its weights alone, a third of the size to move."""
    study = load_study(write_study(tmp_path, STUDY + "anatomy_windows = 2\nfrontier = [400]\nstage0_seq_len = 8192\n"
                                                     "stage0_steps = 300\n[[grid]]\nswitch = [360]\n"))
    kinds = set()
    for run in plan_runs(study):
        kinds.add(run.kind)
        argv = shlex.split(train_command(study, run))
        assert ("--checkpoint.last_save_model_only" in argv) == (run.kind != "stage1"), run.name
    assert kinds == {"stage0", "stage1", "stage2", "dense", "frontier"}


def test_a_grid_axis_off_the_configs_value_names_the_stage_1_folder(tmp_path):
    study = load_study(write_study(tmp_path, STUDY + "[[grid]]\ntopk = [1024]\ndense_layers = [[], [0, 7]]\n"))
    names = [r.name for r in plan_runs(study) if r.seed == 3]
    assert names == ["causal_s3_k1024_dlnone", "causal_s3_k1024", "dense_s3", "causal_s3_k1024_dlnone_switch360",
                     "causal_s3_k1024_switch360"]


@pytest.mark.parametrize("extra, message", [
    ("[[grid]]\nswitch = [350]\n", r"grid 1 switch \[350\] must be multiples of checkpoint.interval = 60"),
    ("[[grid]]\nswitch = [720]\n", r"grid 1 switch \[720\] must be below study.steps = 720"),
    ("[[grid]]\ntopk = []\n", r"grid 1 topk = \[\] must be a non-empty list"),
    ("[[grid]]\nwarmup = [1]\n", r"\[\[grid\]\] block 1 has unknown keys \['warmup'\]"),
    ("", r"needs a \[study\] table and at least one \[\[grid\]\] block"),
    ("[[grid]]\nseeds = [3, 9]\n", r"grid 1 seeds \[9\] are not among study.seeds = \[3, 4\]"),
    ("dense = false\n[[grid]]\nseeds = [3]\n", r"study.seeds \[4\] are in no \[\[grid\]\] block's seeds"),
    ('reported = ["causal_s3"]\n[[grid]]\n',
     r"reported names \['causal_s3'\], which are not dense, frontier or stage-2"),
    ('reported = ["dense_s9"]\n[[grid]]\n', r"names \['dense_s9'\].*those are \['causal_s3_switch360', "),
    ('reported = ["dense_s3", "dense_s3"]\n[[grid]]\n', r"study.reported = .* repeats a name"),
    ("anatomy_windows = -1\n[[grid]]\n", r"study.anatomy_windows = -1 must be an integer >= 0"),
    ("niah_lengths = [8192]\n[[grid]]\n", r"study.niah_lengths = \[8192\] needs study.anatomy_windows > 0"),
    ('anatomy_windows = 2\nniah_lengths = "8192"\n[[grid]]\n', r"study.niah_lengths = '8192' must be a non-empty"),
    ("anatomy_windows = 2\nniah_lengths = [8192, 262144]\n[[grid]]\n",
     r"study.niah_lengths \[262144\] exceed training.seq_len = 131072 in configs/time_to_quality/tiny_128k.toml"),
    ('corpus_digest = "F4EB804E"\n[[grid]]\n', r"study.corpus_digest = 'F4EB804E' must be 8 to 64 lowercase hex"),
    ('corpus_digest = "f4eb"\n[[grid]]\n', r"study.corpus_digest = 'f4eb' must be 8 to 64 lowercase hex"),
])
def test_a_study_mistake_names_the_file_the_key_and_the_value(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        load_study(write_study(tmp_path, STUDY + extra))


TINY = "configs/time_to_quality/tiny_128k.toml"  # STUDY's config: model.flavor = "tiny", 8 layers
MISSPELT = "grid 2 selection ['causl'] are not among the Lighthouse selections ['paper', 'causal', 'strict']"


@pytest.mark.parametrize("grid, message", [
    # was: accepted, and train.py refused each of these when its stage-1 run started, after the runs queued before it
    ('[[grid]]\n[[grid]]\nselection = ["causal", "causl"]\n', MISSPELT),
    ('[[grid]]\nselection = "strict"\n',
     "grid 1 selection = 'strict' must be a non-empty list of names among ['paper', 'causal', 'strict']"),
    ("[[grid]]\ndense_layers = [[], [2, 8, 9]]\n",
     f"grid 1 dense_layers [2, 8, 9] has [8, 9] outside the 8 layers (0..7) of model.flavor = 'tiny' in {TINY}"),
    ("[[grid]]\ndense_layers = [[5, 1, 5]]\n", "grid 1 dense_layers [5, 1, 5] repeats [5]"),
    ("[[grid]]\ndense_layers = [[7, 6, 5, 4, 3, 2, 1, 0]]\n",
     f"grid 1 dense_layers [7, 6, 5, 4, 3, 2, 1, 0] covers all 8 layers of model.flavor = 'tiny' in {TINY}: no layer "
     "of stage 1 would run Lighthouse"),
    ("[[grid]]\ntopk = [2048, -64]\n", "grid 1 topk = [2048, -64] must be a non-empty list of integers >= 1"),
])
def test_a_grid_value_that_train_py_would_refuse_is_named_at_load_with_the_values_it_may_take(tmp_path, grid, message):
    path = write_study(tmp_path, STUDY + grid)
    with pytest.raises(ValueError) as refused:
        load_study(path)
    assert str(refused.value) == f"{path}: {message}"


LAYER = {"levels": 3, "pool": 4, "topk": 256, "tile_budget": 16}  # at 8,192 tokens: 512 coarsest entries, 16 tiles


def study_on_layer(tmp_path: Path, seq_len: int, lighthouse: dict, grid: str = "[[grid]]\n") -> tuple[Path, Path]:
    """A study of `grid` over a job config of `seq_len` tokens whose `[lighthouse]` section is `lighthouse`, and that
    config."""
    config = tmp_path / "job.toml"
    config.write_text(dump_toml({"training": {"seq_len": seq_len}, "lighthouse": lighthouse}))
    return write_study(tmp_path, STUDY.replace(TINY, str(config)) + grid), config


def refusal(path: Path, config: Path, topk: int, seq_len: int, reason: str) -> str:
    """The loader's refusal of block 1's `topk` for `reason`."""
    return (f"{path}: grid 1 topk {topk} cannot run with the [lighthouse] settings of {config} at training.seq_len = "
            f"{seq_len}: {reason}")


def odd_between(low: int, high: int) -> int:
    """A random odd integer in [low, high)."""
    return random.randrange(low | 1, high, 2)


# rule: fresh values that break it alone, over LAYER at 8,192 tokens (512 coarsest entries) unless the rule's own
# length: training.seq_len, the `[lighthouse]` keys that differ from LAYER, the block's topks (the last is refused)
# and the rule's reason. Each was refused only when a stage-1 run started, after the runs queued before it.
LAYER_RULES = {
    "topk-off-the-budget": lambda: (8192, {}, [256, k := 16 * random.randint(1, 32) + random.randint(1, 15)],
                                    f"topk={k} must be a positive multiple of tile_budget=16"),
    "topk-below-the-budget": lambda: (8192, {}, [k := random.randint(1, 15)],
                                      f"topk={k} must be a positive multiple of tile_budget=16"),
    "tiles-do-not-split": lambda: (8192, {}, [256, 16 * (t := odd_between(3, 32))], "seq_len/pool**(levels-1)=512 "
                                   f"coarsest entries do not split into topk/tile_budget={t} equal tiles (topk="
                                   f"{16 * t}, tile_budget=16)"),
    "tiles-too-small": lambda: (8192, {}, [16 * (t := 2 ** random.randint(6, 9))], f"each tile has {512 // t} "
                                f"coarsest entries (seq_len=8192, pool**(levels-1)=16, tiles={t}) but needs at least "
                                "tile_budget=16"),
    "seq-len-off-the-span": lambda: (n := 16 * random.randint(256, 1024) + random.randint(1, 15), {}, [256],
                                     f"seq_len={n} is not divisible by pool**(levels-1)=16 (pool=4, levels=3)"),
    "levels-too-many-for-seq-len": lambda: (4096, {"levels": (L := random.randint(6, 20)), "pool": 8}, [256],
                                            f"levels={L} is too many for seq_len=4096: pool**(levels-1) (pool=8) "
                                            "must divide seq_len"),
    "seq-len-below-1": lambda: (n := random.randint(-4096, 0), {}, [256], f"seq_len={n} must be >= 1"),
    "seq-len-not-an-int": lambda: (n := str(8192 * random.randint(1, 8)), {}, [256],
                                   f"seq_len={n!r} must be an int, not str"),
    "seq-len-too-long": lambda: (n := 2**61 + 16 * random.randint(0, 2**20), {}, [256], f"seq_len={n} is too long: the "
                                 "packed keys of its pyramid entries (seq_len * (levels+1) * levels, levels=3) must "
                                 "fit in int64"),
    "seq-len-off-the-dilation": lambda: (8192, {"scorer": "dilated", "dilation": (d := odd_between(3, 100))},
                                         [256], f"seq_len=8192 is not divisible by dilation={d}"),
    "dilation-past-half": lambda: (n := 4096 * random.randint(1, 4), {"scorer": "dilated", "dilation": n}, [256],
                                   f"dilation={n} leaves one token in each strided sub-sequence of seq_len={n}, so the "
                                   "dilated scorer scores each token against itself alone; it must be at most "
                                   "seq_len / 2"),
    "levels-below-1": lambda: (8192, {"levels": (L := random.randint(-9, 0))}, [256], f"levels={L} must be >= 1"),
    "pool-not-a-power-of-two": lambda: (8192, {"pool": (p := random.choice([3, 5, 6, 12, 24]))}, [256],
                                        f"pool={p} must be a power of two >= 2"),
    "levels-too-many-for-any-seq-len": lambda: (8192, {"levels": (L := random.randint(22, 99)), "pool": 8}, [256],
                                                f"levels={L} is too many for any sequence: pool**(levels-1) (pool=8) "
                                                "must divide seq_len, whose positions count up to 2**63 in int64"),
    "tile-budget-not-a-power-of-two": lambda: (8192, {"tile_budget": (m := random.choice([3, 12, 24, 48]))}, [4 * m],
                                               f"tile_budget={m} must be a power of two >= 2"),
    "levels-not-an-int": lambda: (8192, {"levels": "3"}, [256], "levels='3' must be an int, not str"),
    "unknown-scorer": lambda: (8192, {"scorer": "l2"}, [256], "scorer='l2' is not one of ('norm', 'dilated')"),
    "dilation-below-1": lambda: (8192, {"dilation": (d := random.randint(-9, 0))}, [256], f"dilation={d} must be >= 1"),
    "backend-reference": lambda: (8192, {"backend": "reference"}, [256], "backend='reference' is now "
                                  "implementation='reference' (backend names the inner attention kernel)"),
    "unknown-backend": lambda: (8192, {"backend": "sdpa"}, [256], "backend='sdpa' is not one of ('auto', 'cudnn', "
                                "'flash', 'efficient', 'math', 'flash_attn')"),
    "unknown-implementation": lambda: (8192, {"implementation": "triton"}, [256], "implementation='triton' is not one "
                                       "of ('auto', 'fused', 'reference')"),
}


@pytest.mark.parametrize("rule", LAYER_RULES)
def test_a_stage_1_layer_that_train_py_would_refuse_is_named_at_load_with_the_rules_reason(tmp_path, rule):
    seq_len, layer, topks, reason = LAYER_RULES[rule]()
    path, config = study_on_layer(tmp_path, seq_len, {**LAYER, **layer}, f"[[grid]]\ntopk = {topks}\n")
    with pytest.raises(ValueError) as refused:
        load_study(path)
    assert str(refused.value) == refusal(path, config, topks[-1], seq_len, reason)


def test_lighthouse_keys_the_config_omits_take_lighthouse_configs_defaults(tmp_path):
    """Levels 3, pool 2, topk 1536 and tile budget 128: 6,144 tokens fill the 12 tiles, 4,096 do not split into them."""
    path, _ = study_on_layer(tmp_path, 6144, {})
    assert [run.name for run in plan_runs(load_study(path)) if run.seed == 3] == [
        "causal_s3", "dense_s3", "causal_s3_switch360"]
    path, config = study_on_layer(tmp_path, 4096, {})
    with pytest.raises(ValueError) as refused:
        load_study(path)
    assert str(refused.value) == refusal(path, config, 1536, 4096, "seq_len/pool**(levels-1)=1024 coarsest entries do "
                                         "not split into topk/tile_budget=12 equal tiles (topk=1536, tile_budget=128)")


def test_a_config_without_training_seq_len_has_its_settings_checked_and_its_length_left_to_train_py(tmp_path):
    config = tmp_path / "job.toml"
    config.write_text(dump_toml({"lighthouse": LAYER}))
    path = write_study(tmp_path, STUDY.replace(TINY, str(config)) + "[[grid]]\n[[grid]]\ntopk = [1024, 24]\n")
    with pytest.raises(ValueError) as refused:
        load_study(path)  # 1024: too many tiles at 8,192 tokens, but torchtitan's default length is not known here
    assert str(refused.value) == (f"{path}: grid 2 topk 24 cannot run with the [lighthouse] settings of {config}: "
                                  "topk=24 must be a positive multiple of tile_budget=16")


def test_tasks_refuses_a_topk_the_layer_cannot_run_in_one_line_with_exit_2_without_torch(tmp_path):
    path = write_study(tmp_path, STUDY + "[[grid]]\n[[grid]]\ntopk = [2048, 96]\n")
    out = run_without_torch("scripts/payoff_map.py", ["tasks", str(path)])
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"error: {path}: grid 2 topk 96 cannot run with the [lighthouse] settings of {TINY} at training.seq_len = "
        "131072: topk=96 must be a positive multiple of tile_budget=64"]


def test_tasks_refuses_a_misspelt_selection_in_one_line_with_exit_2_without_torch(tmp_path):
    path = write_study(tmp_path, STUDY + '[[grid]]\n[[grid]]\nselection = ["causal", "causl"]\n')
    out = run_without_torch("scripts/payoff_map.py", ["tasks", str(path)])
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [f"error: {path}: {MISSPELT}"]


def test_the_command_line_refuses_a_bad_study_in_one_line_with_exit_2(tmp_path):
    path = write_study(tmp_path, STUDY.replace("steps = 720", "steps = 1") + "[[grid]]\n")
    out = run_python(["scripts/payoff_map.py", "tasks", str(path)], env=child_env(), timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: {path}: study.steps = 1 must be an integer >= 2"]


def test_tasks_prints_the_queue_without_importing_torch():
    code = ("import runpy, sys\nsys.argv = ['scripts/payoff_map.py', 'tasks', 'configs/payoff/example_cpu.toml']\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as end:\n"
            "    print(end.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(), capture_output=True, text=True,
                         timeout=60)
    *queue, last = out.stdout.splitlines()
    assert last == "0 False", out.stderr[-2000:]
    assert [line.split("\t")[0] for line in queue[:4]] == [
        "causal_s0", "dense_s0", "dense_s0_steps4", "causal_s0_switch4"]


def test_niah_lengths_too_short_for_the_needle_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    path = write_study(tmp_path, STUDY + "anatomy_windows = 2\nniah_lengths = [64, 8192]\n[[grid]]\n")
    assert script_exit_code("payoff_map.py", ["run", str(path)], monkeypatch) == 2  # in this process: no start-up
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [f"error: {path}: study.niah_lengths: NIAH lengths [64] are shorter "
                                        "than the needle and question (68 tokens)"]


def test_run_refuses_a_corpus_whose_digest_is_not_the_studys_before_it_queues_anything(tmp_path):
    """The digest is the shell's `find . -type f | sort | xargs sha256sum | sha256sum` over the corpus folder, so
    the study's pin and a shell check agree; a study pins a prefix of it."""
    corpus = tmp_path / "run" / "corpus"
    for split in ("train", "heldout"):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "corpus.jsonl").write_bytes(random.randbytes(4096))
    listing = subprocess.run("find . -type f | sort | xargs sha256sum | sha256sum", shell=True, cwd=corpus,
                             capture_output=True, text=True, check=True).stdout.split()[0]
    assert corpus_digest(corpus) == listing
    other = format(int(listing[:12], 16) ^ 1, "012x")
    study = example_study(tmp_path, EXTENSION_EXAMPLE, seeds=[0], corpus_digest=other)
    refused = run_python(["scripts/payoff_map.py", "run", str(study)], env=child_env(), timeout=120)
    assert refused.returncode == 2 and not (tmp_path / "run" / "tasks.tsv").exists()
    assert refused.stderr.strip() == (f"error: {study}: study.corpus_digest = {other!r}, but {corpus} gives "
                                      f"{listing[:12]}: runs on another corpus would not join the study's records "
                                      "(built from other sources or another Python?)")
    study = example_study(tmp_path, EXTENSION_EXAMPLE, seeds=[0], corpus_digest=listing[:12])
    taken = run_python(["scripts/payoff_map.py", "run", str(study), "--stop-after", "0"], env=child_env(),
                       timeout=120)
    assert taken.returncode == 1 and "[queue] stopping, its time is up: SIGTERM to no running task" in taken.stdout


@pytest.mark.parametrize("layout", ["same folder name", "no files"])
def test_run_refuses_corpus_sources_it_cannot_split_in_one_line_naming_the_key(tmp_path, layout):
    """A missing corpus is built from `study.corpus_sources`; sources that share a folder name (documents are named
    by it) or hold no file to split are the study's mistake, named by its key, before anything is queued."""
    names = ["src", "src"] if layout == "same folder name" else ["empty"]
    sources = [tmp_path / f"source{i}" / name for i, name in enumerate(names)]
    for source in sources:
        source.mkdir(parents=True)
    if layout == "same folder name":
        for source in sources:
            (source / f"m{random.randrange(10**6)}.py").write_text(f"x = {random.random()}\n")
    study = example_study(tmp_path, corpus_sources=[str(s) for s in sources])
    out = run_python(["scripts/payoff_map.py", "run", str(study)], env=child_env(), timeout=120)
    assert out.returncode == 2 and not (tmp_path / "run" / "tasks.tsv").exists(), out.stderr[-2000:]
    shown = [str(s) for s in sources]
    expected = (f"error: {study}: study.corpus_sources {shown} share a folder name; documents are named by it"
                if layout == "same folder name" else
                f"error: {study}: study.corpus_sources {shown}: 0 files give 0 training and 0 held-out documents "
                "(files); both must be non-empty")
    assert out.stderr.strip().splitlines() == [expected]


def basin_untrained(tmp_path: Path) -> str:
    """The basin study with its run folder under `tmp_path`, not created: a checkout where nothing was trained."""
    raw = load_toml(BASIN)
    raw["study"]["run"] = str(tmp_path / "run")
    return str(write_study(tmp_path, dump_toml(raw)))


def test_a_report_of_the_checked_in_records_alone_needs_no_run_folder(tmp_path, monkeypatch):
    """A fresh checkout re-draws the study's report from its records (here those of seeds 2 and 3): `--include`
    only, no run folder."""
    records = [r for r in json.loads((REPO / "docs" / "records" / "payoff_basin.json").read_text())["records"]
               if r["seed"] in (2, 3)]
    include = tmp_path / "earlier.json"
    include.write_text(json.dumps(records))
    out = tmp_path / "report" / "payoff"
    argv = ["report", basin_untrained(tmp_path), "--include", str(include), "--out", str(out)]
    assert script_exit_code("payoff_map.py", argv, monkeypatch) == 0
    dense = json.loads(out.with_suffix(".json").read_text())["summary"]["arms"]["dense"]["seeds"]
    assert {seed: run["final"] for seed, run in dense.items()} == {
        str(r["seed"]): round(r["final_heldout_loss"], 4) for r in records if r["name"].startswith("dense_")}


@pytest.mark.parametrize("content", ["{", json.dumps({"study": "s.toml"}), json.dumps({"commit": 7}), "[]"],
                         ids=["not-json", "no-commit", "commit-not-a-string", "not-an-object"])
def test_a_report_names_a_study_record_it_cannot_take_the_commit_from_in_one_line_with_exit_2(
        tmp_path, monkeypatch, capsys, content):
    """`run` records the commit of the tree it queued in <run>/study.json; a report without --commit reads it."""
    study = basin_untrained(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "study.json").write_text(content)
    assert script_exit_code("payoff_map.py", ["report", study, "--out", str(tmp_path / "r" / "p")], monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: the study record {tmp_path / 'run' / 'study.json'} ")
    assert err[0].endswith("expected an object with the commit `run` ran (a string)")


@pytest.mark.parametrize("content, message", [
    (None, "cannot read it as JSON ([Errno 2] No such file"),
    ("{not json", "cannot read it as JSON (Expecting property name"),
    ("[1, 2]", "expected a list of run records or a report's payoff.json"),
])
def test_a_report_include_that_is_missing_or_not_records_is_refused_in_one_line_with_exit_2(
        tmp_path, monkeypatch, capsys, content, message):
    include = tmp_path / "earlier.json"
    if content is not None:
        include.write_text(content)
    code = script_exit_code("payoff_map.py", ["report", basin_untrained(tmp_path), "--include", str(include)],
                            monkeypatch)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: --include {include}: {message}"), lines


def test_the_bootstrap_interval_holds_the_mean_and_narrows_with_agreement():
    rng = random.Random()
    values = [rng.gauss(0.05, 0.03) for _ in range(8)]
    low, high = payoff.bootstrap_interval(values)
    assert low < np.mean(values) < high
    tight = payoff.bootstrap_interval([0.05 + v / 100 for v in values])
    assert tight[1] - tight[0] < (high - low) / 50
    assert payoff.bootstrap_interval([0.1]) is None


def record(name: str, seed: int, final: float, speedup: float | None = None) -> dict:
    r = {"name": name, "seed": seed, "final_heldout_loss": final, "commit": "abc"}
    if speedup is not None:
        r["time_to_quality_speedup"] = speedup
    return r


def test_distributions_count_groups_and_pair_each_arm_with_dense_and_the_baseline_of_the_same_seeds():
    records = [record("dense", 0, 2.33), record("dense_s1", 1, 2.24), record("dense_s2", 2, 2.25),
               record("causal_s0_switch360", 0, 2.30, 1.4), record("causal_s1_switch360", 1, 2.31, 0.9),
               record("causal_s2_switch360", 2, 2.32, 0.8), record("causal_s1_switch360_rewarm36", 1, 2.26, 0.7),
               record("causal_s2_switch360_rewarm36", 2, 2.27, 0.6)]
    summary = payoff.distributions(records, threshold=2.2877, baseline="causal_switch360")
    assert (summary["arms"]["dense"]["lower"], summary["arms"]["dense"]["upper"]) == (2, 1)
    assert summary["arms"]["causal_switch360"]["lower"] == 0
    assert summary["arms"]["causal_switch360"]["time_to_quality_median"] == 0.9
    pairs = {(p["arm"], p["reference"]): p for p in summary["paired"]}
    assert pairs["causal_switch360", "dense"]["differences"] == [-0.03, 0.07, 0.07]
    rewarm = pairs["causal_switch360_rewarm36", "causal_switch360"]
    assert rewarm["seeds"] == [1, 2] and rewarm["differences"] == [-0.05, -0.05] and rewarm["below_zero"] == 2
    assert payoff.largest_gap_split([2.24, 2.25, 2.33, 2.32]) == pytest.approx(2.285)
    table = payoff.markdown(summary)
    assert "| dense | 2.3300 | 2.2400 (L) | 2.2500 (L) | 2 / 1 |" in table


def test_the_separation_step_is_where_the_lower_group_stays_below_the_upper_for_good():
    curves = {0: [(1, 6.0), (60, 2.7), (120, 2.6), (180, 2.55), (240, 2.5)],
              1: [(1, 6.1), (60, 2.6), (120, 2.62), (180, 2.45), (240, 2.4)],
              2: [(1, 5.9), (60, 2.8), (120, 2.65), (180, 2.5), (240, 2.41)]}
    assert payoff.separation_step(curves, lower={1, 2}) == 180
    assert payoff.separation_step(curves, lower=set()) is None


def tiny_config(tmp_path: Path) -> Path:
    """The debug model at 256 tokens on local files, validated and saved every 2 steps."""
    config = load_toml(REPO / "configs" / "debug.toml")
    for key, value in [("training.dataset", "local"), ("training.seq_len", 256), ("training.local_batch_size", 1),
                       ("training.global_batch_size", 1), ("validation.enable", True), ("validation.dataset", "local"),
                       ("validation.seq_len", 256), ("validation.local_batch_size", 1), ("validation.freq", 2),
                       ("validation.steps", 2), ("checkpoint.interval", 2), ("lighthouse.topk", 16),
                       ("lighthouse.tile_budget", 8)]:
        set_key(config, key, value)
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(config))
    return path


EXAMPLE = REPO / "configs" / "payoff" / "example_cpu.toml"
EXTENSION_EXAMPLE = REPO / "configs" / "payoff" / "example_cpu_extension.toml"


def example_study(tmp_path: Path, example: Path = EXAMPLE, **study: object) -> Path:
    """A CPU-sized example study as checked in (`example`), with its run and corpus folders under `tmp_path` and
    `study`'s keys added."""
    raw = load_toml(example)
    raw["study"].update(run=str(tmp_path / "run"), corpus=str(tmp_path / "run" / "corpus"), **study)
    path = tmp_path / "example.toml"
    path.write_text(dump_toml(raw))
    return path


@pytest.mark.slow
@pytest.mark.timeout(1200)  # eight training processes and the per-token pass, two at a time
def test_the_cpu_example_runs_as_written_and_reports_matched_compute_first_then_every_seed_and_the_anatomy(tmp_path):
    """The example builds its corpus, trains dense, the defaults and the frontier over two seeds, and reports
    "at equal GPU-seconds" first; with the per-token pass added, the anatomy and NIAH too."""
    study = example_study(tmp_path, anatomy_windows=2, niah_lengths=[96])
    env = child_env()
    run = lambda *argv: run_python(["scripts/payoff_map.py", *argv, str(study)], env=env, timeout=900)  # noqa: E731
    trained = run("run", "--gpus", "0,1")
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "built the corpus" in trained.stdout
    reported = run("report", "--device", "cpu")
    assert reported.returncode == 0, reported.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "report" / "payoff.json").read_text())["summary"]
    assert set(summary["arms"]) == {"dense", "causal_switch4", "dense_steps4"}
    assert all(set(arm["seeds"]) == {"0", "1"} for arm in summary["arms"].values())
    assert summary["incomplete"] == []
    records = json.loads((tmp_path / "run" / "report" / "payoff.json").read_text())["records"]
    for record in records:  # each record says which arm it is: stage 1's dense layers and k, the switch, no stage 0
        lighthouse = record["name"].startswith("causal")
        assert (record["dense_layers"], record["topk"]) == (([0], 16) if lighthouse else (None, None)), record["name"]
        assert (record["switch_step"] == 4) == lighthouse
        assert record["stage0_seq_len"] is None and record["stage0_steps"] is None
    placed = summary["matched_compute"]
    assert {seed: [p["steps"] for p in front] for seed, front in placed["frontiers"].items()} == {
        "0": [4, 8], "1": [4, 8]}
    assert set(placed["arms"]["causal_switch4"]["seeds"]) == {"0", "1"}
    assert all(row["dense_equivalent_steps"] > 0 for row in placed["arms"]["causal_switch4"]["seeds"].values())
    table = (tmp_path / "run" / "report" / "payoff.md").read_text()
    warned = placed["step_time_spread"] > 0.02  # a loaded CPU: the time check's warning leads
    assert table.startswith("**Time check failed**" if warned else "At equal GPU-seconds")
    assert table.index("At equal GPU-seconds") < table.index("At matched steps")
    assert "bits per byte" in table and all("bits_per_byte" in row for arm in summary["arms"].values()
                                            for row in arm["seeds"].values())
    anatomy = json.loads((tmp_path / "run" / "report" / "payoff_anatomy.json").read_text())
    carried = [c["carried"] for c in anatomy["differences"][0]["position"].values()]
    assert sum(carried) == pytest.approx(1.0)
    assert set(anatomy["niah"]) == {name for seed in (0, 1)  # the final models; the frontier runs are not scored
                                    for name in (f"dense_s{seed}", f"causal_s{seed}_switch4")}
    assert "**NIAH**" in table
    for name in ("payoff_finals.png", "payoff_steps.png", "payoff_anatomy.png", "payoff_matched_compute.png"):
        assert (tmp_path / "run" / "report" / name).is_file(), name
    stage2 = (tmp_path / "run" / "causal_s0_switch4" / "metrics.jsonl").read_text()
    assert '"step": 5' in stage2 and '"step": 8' in stage2


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ten training processes and two per-token passes, two at a time
def test_the_cpu_extension_example_runs_as_written_and_reports_the_loss_by_position_past_stage_0_at_matched_compute(
        tmp_path):
    """Stage 0 at 64 tokens, then every fresh run at 256 from its weights; the per-token pass scores the frontier
    runs too, and the report gives every model's loss per position class and past stage 0, and each arm minus its
    seed's per-class frontier at its dense-equivalent steps, after the matched-compute table."""
    study = example_study(tmp_path, EXTENSION_EXAMPLE)
    env = child_env()
    run = lambda *argv: run_python(["scripts/payoff_map.py", *argv, str(study)], env=env, timeout=900)  # noqa: E731
    trained = run("run", "--gpus", "0,1")
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    reported = run("report", "--device", "cpu")
    assert reported.returncode == 0, reported.stderr[-3000:]
    folder = tmp_path / "run"
    payoff_json = json.loads((folder / "report" / "payoff.json").read_text())
    summary, records = payoff_json["summary"], payoff_json["records"]
    assert summary["incomplete"] == []
    assert all((r["stage0_seq_len"], r["stage0_steps"]) == (64, 4) for r in records)
    assert summary["card_mixed"] == [] and len({card for r in records for card in r["cards"]}) == 1, \
        "every record lists its seed's stage 0 and its own runs' card, here the one CPU"
    typed = shlex.join(["scripts/payoff_map.py", "run", "--gpus", "0,1", str(study)])
    assert {r["command"] for r in records} == {typed}, "the queue command as typed"
    for r in records:  # the weights it started from: its seed's stage 0, by its last held-out loss
        logged = (folder / f"stage0_s{r['seed']}" / "metrics.jsonl").read_text().splitlines()
        validated = [m["validation/dense_loss"] for m in map(json.loads, logged) if "validation/dense_loss" in m]
        assert r["stage0_final_heldout_loss"] == validated[-1]
    for seed in (0, 1):
        for name in (f"causal_s{seed}", f"dense_s{seed}", f"dense_s{seed}_steps4"):  # the runs that start fresh
            log = (folder / "queue" / f"{name}.log").read_text()
            assert f"Loading the checkpoint from {folder}/stage0_s{seed}/checkpoint/step-4." in log, name
            assert "Finished loading the checkpoint" in log, name
        saved = FileSystemReader(str(folder / f"stage0_s{seed}" / "checkpoint" / "step-4")).read_metadata()
        assert not any(key.startswith(("optimizer", "train_state"))
                       for key in saved.state_dict_metadata), "weights alone"
        scored = json.loads((folder / "anatomy" / f"s{seed}_0.json").read_text())["models"]
        assert {name: model["checkpoint"] for name, model in scored.items()} == {  # the frontier at its last step
            f"dense_s{seed}": f"{folder}/dense_s{seed}/checkpoint/step-8",
            f"dense_s{seed}_steps4": f"{folder}/dense_s{seed}_steps4/checkpoint/step-4",
            f"causal_s{seed}_switch4": f"{folder}/causal_s{seed}_switch4/checkpoint/step-8"}
    by_position = summary["loss_by_position"]
    assert by_position["classes"] == ["0-64", "64-256", "past stage 0"]
    scored = {name: classes for models in by_position["models"].values() for name, classes in models.items()}
    carried = {run_folder(r["name"], r["seed"]): r["position_losses"] for r in records if "position_losses" in r}
    assert carried == scored, "every scored model's record carries its class losses, for a later report to join"
    dump = np.load(folder / "anatomy" / "s1_0.npz")
    assert by_position["models"]["1"]["dense_s1"]["past stage 0"] == pytest.approx(
        dump["loss/dense_s1"].astype(np.float64)[:, 64:].mean())
    placed = summary["matched_compute"]["arms"]["causal_switch4"]["seeds"]
    arm = by_position["arms"]["causal_switch4"]
    assert set(arm["seeds"]) == {"0", "1"}
    for seed, row in arm["seeds"].items():
        models, front = by_position["models"][seed], by_position["frontiers"][seed]
        steps = [p["steps"] for p in front]
        assert steps == [4, 8] and row["dense_equivalent_steps"] == pytest.approx(
            placed[seed]["dense_equivalent_steps"], abs=0.051)
        inside = steps[0] <= row["dense_equivalent_steps"] <= steps[-1]  # a loaded CPU's seconds may fall outside
        for cls in by_position["classes"]:
            expected = np.interp(row["dense_equivalent_steps"], steps, [models[p["name"]][cls] for p in front])
            loss = models[row["name"]][cls]
            got = row["classes"][cls]
            assert got["difference"] == (pytest.approx(loss - expected, abs=1e-9) if inside else None), (seed, cls)
            assert got["minus_dense"] == pytest.approx(loss - models[f"dense_s{seed}"][cls], abs=1e-9)
    for cls in by_position["classes"]:
        diffs = [row["classes"][cls]["difference"] for row in arm["seeds"].values()]
        assert arm["matched_compute"][cls]["n"] == sum(d is not None for d in diffs)
    table = (folder / "report" / "payoff.md").read_text()
    assert table.index("At equal GPU-seconds") < table.index("Loss by position") < table.index("At matched steps")
    assert "| causal_switch4 | past stage 0 | 0,1 |" in table
    assert (folder / "report" / "payoff_loss_by_position.png").is_file()


def test_an_extension_studys_per_token_pass_scores_each_frontier_run_at_its_own_last_step_and_others_do_not(
        tmp_path):
    """Loss by position at matched compute needs the frontier per position class: each seed's per-token pass reads
    `dense_s<seed>_steps<n>/checkpoint/step-<n>` in an extension study, and only the final models elsewhere."""
    queue = runpy.run_path(str(REPO / "scripts" / "payoff_map.py"))["queue"]
    for extension in (True, False):
        extra = "stage0_seq_len = 8192\nstage0_steps = 300\n" if extension else ""
        study = write_study(tmp_path, STUDY + f"anatomy_windows = 2\nfrontier = [400, 600]\n{extra}[[grid]]\n")
        for order in ("seed", "long-first"):
            tasks = {name: (waits, command) for name, waits, command in queue(load_study(study), order=order)}
            waits, command = tasks["anatomy_s3_0"]
            read = dict(argv.split("=", 1) for argv in shlex.split(command) if argv.startswith(("dense_", "causal_")))
            frontier = {"dense_s3_steps600": "out/dense_s3_steps600/checkpoint/step-600",
                        "dense_s3_steps400": "out/dense_s3_steps400/checkpoint/step-400"} if extension else {}
            assert read == {"dense_s3": "out/dense_s3/checkpoint/step-720", **frontier,
                            "causal_s3_switch360": "out/causal_s3_switch360/checkpoint/step-720"}, order
            assert set(waits) == set(read)


def test_submit_passes_the_options_after_the_double_dash_to_every_sbatch_call(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\necho $$\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    study = example_study(tmp_path)
    (tmp_path / "run" / "corpus" / "train").mkdir(parents=True)
    (tmp_path / "run" / "corpus" / "heldout").mkdir()
    assert script_exit_code("payoff_map.py", ["submit", str(study), "--", "--partition=gpu",
                                            "--gres=gpu:1"], monkeypatch) == 0
    lines = calls.read_text().splitlines()
    assert len(lines) == len(plan_runs(load_study(study))) == 8
    assert all("--partition=gpu --gres=gpu:1" in line for line in lines)


@pytest.mark.parametrize("argv, message", [
    (["run", str(EXAMPLE), "--", "--partition=gpu"], "for submit only"),
    (["submit", str(EXAMPLE), "--", "--partition=gpu"], "needs SLURM's sbatch on PATH"),
], ids=["run-with-sbatch-options", "submit-without-sbatch"])
def test_sbatch_options_outside_submit_or_submit_without_sbatch_is_one_line_and_exit_2(
        argv, message, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    assert script_exit_code("payoff_map.py", argv, monkeypatch) == 2
    assert message in capsys.readouterr().err


def test_long_first_starts_dense_then_every_stage_1_then_stage_2_by_its_dense_steps(tmp_path):
    study = load_study(write_study(tmp_path, STUDY + "anatomy_windows = 2\n[[grid]]\nswitch = [360]\n"
                                                     "rewarm_steps = [0, 36]\n[[grid]]\nswitch = [180]\n"))
    runs = long_first(plan_runs(study))
    assert [r.name for r in runs] == [
        "dense_s3", "dense_s4", "causal_s3", "causal_s4", "causal_s3_switch180", "causal_s4_switch180",
        "causal_s3_switch360", "causal_s3_switch360_rewarm36", "causal_s4_switch360", "causal_s4_switch360_rewarm36"]
    assert sorted(runs, key=lambda r: r.name) == sorted(plan_runs(study), key=lambda r: r.name), "the same runs"
    out = run_python(["scripts/payoff_map.py", "tasks", str(study.path), "--order", "long-first"], env=child_env(),
                     timeout=120)
    assert out.returncode == 0, out.stderr
    names = [line.split("\t")[0] for line in out.stdout.splitlines()]
    assert names == [r.name for r in runs] + ["anatomy_s3_0", "anatomy_s4_0"], "each seed's per-token pass comes last"
    waits = dict(line.split("\t")[:2] for line in out.stdout.splitlines())
    assert waits["anatomy_s3_0"] == "dense_s3,causal_s3_switch180,causal_s3_switch360,causal_s3_switch360_rewarm36"


def test_arm_first_runs_each_stage_2_right_after_its_stage_1_and_the_rest_in_the_seed_order(tmp_path):
    study = load_study(write_study(tmp_path, STUDY + "[[grid]]\nswitch = [360]\nrewarm_steps = [0, 36]\n"
                                                     "[[grid]]\ndense_layers = [[0], []]\nswitch = [360]\n"))
    seeded, runs = plan_runs(study), arm_first(plan_runs(study))
    assert sorted(r.name for r in runs) == sorted(r.name for r in seeded), "the same runs"
    for i, run in enumerate(runs):
        if run.kind == "stage2":  # its stage 1, then only stage-2 runs of that stage 1 between them
            start = [r.name for r in runs].index(run.stage1.name)
            assert start < i and all(r.kind == "stage2" and r.stage1 == run.stage1 for r in runs[start + 1:i])
    others = [r.name for r in seeded if r.kind != "stage2"]
    assert [r.name for r in runs if r.kind != "stage2"] == others
    assert [r.name for r in runs][:4] == ["causal_s3", "causal_s3_switch360", "causal_s3_switch360_rewarm36",
                                          "dense_s3"]
    out = run_python(["scripts/payoff_map.py", "tasks", str(study.path), "--order", "arm-first"], env=child_env(),
                     timeout=120)
    assert out.returncode == 0, out.stderr
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == [r.name for r in runs]


def test_arm_first_scores_each_model_right_after_it_so_no_later_pass_needs_an_earlier_checkpoint(tmp_path):
    """On one GPU a lease ends, or its machine is lost, between any two tasks: with each scored model's per-token
    pass right after it, what finished is scored and no checkpoint must outlive its own pass."""
    queue = runpy.run_path(str(REPO / "scripts" / "payoff_map.py"))["queue"]
    extension = "anatomy_windows = 2\nfrontier = [400, 600]\nstage0_seq_len = 8192\nstage0_steps = 300\n"
    study = load_study(write_study(tmp_path, STUDY + extension + "[[grid]]\nswitch = [360]\n"))
    tasks = queue(study, order="arm-first")
    names = [name for name, _, _ in tasks]
    read = {}
    for i, (name, waits, command) in enumerate(tasks):
        if name.startswith("anatomy_"):
            models = dict(a.split("=", 1) for a in shlex.split(command) if a.startswith(("dense_", "causal_")))
            assert list(models) == list(waits) == [names[i - 1]], "the model trained just before, alone"
            assert name == f"anatomy_{names[i - 1]}" and f"--out out/anatomy/{names[i - 1]} " in command
            read.update(models)
    runs = arm_first(plan_runs(study))
    expected = scored_models(study, runs)
    assert read == {name: f"out/{name}/checkpoint/step-{step}"
                    for models in expected.values() for name, step in models.items()}
    assert [n for n in names if not n.startswith("anatomy_")] == [r.name for r in runs]


def test_only_keeps_the_named_tasks_in_queue_order_and_names_what_it_cannot_keep(tmp_path):
    """`--only` cuts the queue to what fits a lease of known length: the named tasks, unchanged and in the order's
    sequence; a name that is no task, or a task whose waits are left out, is a config error (exit 2) naming them."""
    extension = "anatomy_windows = 2\nfrontier = [400, 600]\nstage0_seq_len = 8192\nstage0_steps = 300\n"
    study = write_study(tmp_path, STUDY + extension + "[[grid]]\nswitch = [360]\n")
    tasks = ["scripts/payoff_map.py", "tasks", str(study), "--order", "arm-first"]
    whole = run_python(tasks, env=child_env(), timeout=120)
    assert whole.returncode == 0, whole.stderr
    lines = whole.stdout.splitlines()
    chosen = ["anatomy_dense_s3_steps400", "stage0_s3", "dense_s3_steps400"]  # not in queue order
    cut = run_python([*tasks, "--only", ",".join(chosen)], env=child_env(), timeout=120)
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout.splitlines() == [line for line in lines if line.split("\t")[0] in chosen]
    assert [line.split("\t")[0] for line in cut.stdout.splitlines()] == [
        "stage0_s3", "dense_s3_steps400", "anatomy_dense_s3_steps400"]
    unknown = run_python([*tasks, "--only", "stage0_s3,dense_s9"], env=child_env(), timeout=120)
    assert unknown.returncode == 2 and "['dense_s9'] are not tasks of this queue" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    orphan = run_python([*tasks, "--only", "dense_s3_steps400"], env=child_env(), timeout=120)
    assert orphan.returncode == 2 and "{'dense_s3_steps400': ['stage0_s3']} wait for tasks not named" in orphan.stderr


def test_listing_finished_runs_as_reported_renames_no_other_per_token_pass_of_the_arm_first_queue(tmp_path):
    """A pass named by its place in the seed's queue would, once the runs before it are reported, take the name
    and the dump of a pass that already ran, and overwrite that dump with another model's losses."""
    queue = runpy.run_path(str(REPO / "scripts" / "payoff_map.py"))["queue"]
    extension = "anatomy_windows = 2\nfrontier = [400, 600]\nstage0_seq_len = 8192\nstage0_steps = 300\n"
    before = queue(load_study(write_study(tmp_path, STUDY + extension + "[[grid]]\n")), order="arm-first")
    reported = [name for name, _, _ in before if name.startswith(("causal_s3_switch", "dense_s3"))]
    after = queue(load_study(write_study(tmp_path, STUDY + extension + f"reported = {reported}\n[[grid]]\n")),
                  order="arm-first")
    passes = {name: command for name, _, command in before if name.startswith("anatomy_")}
    left = [(name, command) for name, _, command in after if name.startswith("anatomy_")]
    assert left and len(left) < len(passes)
    assert all(passes[name] == command for name, command in left), "the same name, the same models, the same dump"


def test_a_grid_block_on_some_seeds_only_adds_its_arms_there_and_every_seed_of_a_block_gets_dense(tmp_path):
    study = load_study(write_study(tmp_path, STUDY + "[[grid]]\nrewarm_steps = [0, 36]\nseeds = [3]\n"
                                                     "[[grid]]\nswitch = [180]\nseeds = [4]\n"))
    assert [r.name for r in plan_runs(study)] == ["causal_s3", "dense_s3", "causal_s3_switch360",
                                                  "causal_s3_switch360_rewarm36", "causal_s4", "dense_s4",
                                                  "causal_s4_switch180"]


def test_a_switch_arms_record_names_the_queues_of_its_stage_1_and_stage_2_and_a_run_without_one_keeps_the_default(
        tmp_path):
    """A stage 2 often trains in a later queue than its stage 1 (another allocation, another `--only`): the record
    names both commands, the last as `command`."""
    queue_commands = runpy.run_path(str(REPO / "scripts" / "payoff_map.py"))["queue_commands"]
    logs = tmp_path / "queue"
    logs.mkdir()
    first, second = "scripts/payoff_map.py run s.toml --only causal_s1", "scripts/payoff_map.py run s.toml"
    for name, queues in {"causal_s1": [first], "causal_s1_switch360": [first, second], "dense_s0": [second]}.items():
        (logs / f"{name}.json").write_text(json.dumps({"name": name, "returncode": 0, "command": f"train {name}",
                                                       "queues": queues}))
    arm = {"name": "causal_s1_switch360", "seed": 1, "switch_step": 360}
    assert queue_commands(tmp_path, arm) == {"command": second, "commands": [first, second]}
    assert queue_commands(tmp_path, {"name": "dense", "seed": 0, "switch_step": None}) == {"command": second}
    assert queue_commands(tmp_path, {"name": "dense_s2", "seed": 2, "switch_step": None}) == {}


@pytest.mark.parametrize("command", ["tasks", "run"])
def test_a_study_whose_runs_are_all_reported_says_that_nothing_is_left_to_queue(monkeypatch, capsys, command):
    """The basin study's runs are all under `reported` (their records are the results): `tasks` and `run` say so in
    one line rather than print nothing or start an empty queue."""
    monkeypatch.chdir(REPO)
    assert script_exit_code("payoff_map.py", [command, "configs/payoff/tiny_128k_basin.toml"], monkeypatch) == 0
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err == ("configs/payoff/tiny_128k_basin.toml: no task left to queue: every run of the study is "
                           "listed under [study] reported (its records are kept, not retrained); take names out of "
                           "reported to train them again\n")


def test_a_report_of_part_of_a_study_names_the_runs_it_leaves_out(tmp_path, monkeypatch, capsys):
    """The frontier study reported from the basin's records alone (its own runs neither trained here nor included)
    still writes its report, and says which of its scored runs have no record, on stderr and in the summary; with
    the frontier's own records included nothing is left out."""
    monkeypatch.chdir(REPO)
    study = "configs/payoff/tiny_128k_frontier.toml"
    for include, left_out in (("payoff_basin.json", 24), ("payoff_frontier.json", 0)):
        out = tmp_path / include.removesuffix(".json")
        argv = ["report", study, "--include", f"docs/records/{include}", "--out", str(out)]
        assert script_exit_code("payoff_map.py", argv, monkeypatch) == 0
        unrecorded = json.loads(out.with_suffix(".json").read_text())["summary"]["unrecorded"]
        assert len(unrecorded) == left_out and all(name.startswith("dense_s") for name in unrecorded)
        note = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
        assert note == ([f"note: 24 run(s) of {study} have no record here (none finished under "
                         "outputs/payoff/tiny_128k_frontier, none in --include): dense_s0_steps400, "
                         "dense_s0_steps510, dense_s0_steps600, dense_s1_steps400, ...; the report covers the others "
                         "(summary.unrecorded lists them)"] if left_out else [])
