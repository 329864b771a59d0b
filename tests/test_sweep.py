"""scripts/sweep.py (recipe.experiments.sweep, recipe.experiments.sweep_summary): grid -> validated TOMLs, run names and
folders, stage
chains, submit lines, local runs, summary table."""
from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from lighthouse import LighthouseConfig
from recipe import progress
from recipe.experiments.sweep import LIGHTHOUSE_AXES, MANIFEST, create_sweep
from recipe.experiments.sweep_summary import print_summary
from recipe.logs import run_logs
from recipe.toml_config import dump_toml

from .helpers import child_env, script_exit_code
from .warm_python import run_python

REPO = Path(__file__).resolve().parents[1]

needs_recipe = pytest.mark.skipif(not (REPO / "recipe" / "train" / "job_config.py").exists(),
                                  reason="the recipe's JobConfig extension (recipe/train/job_config.py) is not present")


def _base(tmp_path: Path, rng: random.Random, **sections) -> Path:
    """A base config whose custom section is the recipe's `[lighthouse]`, with random lengths."""
    config = {
        "job": {"dump_folder": str(tmp_path / "outputs"), "description": "base",
                "custom_config_module": "recipe.train.job_config"},
        "model": {"name": "llama3_lighthouse", "flavor": "debug"},
        "lighthouse": {"enable": False, "levels": 3, "pool": 2, "topk": 32, "tile_budget": 16, "scorer": "norm"},
        "training": {"seq_len": rng.choice([1024, 2048]), "steps": rng.randrange(20, 200)},
        "checkpoint": {"enable": False, "folder": "ckpt", "interval": 10},
        "metrics": {"enable_tensorboard": True, "log_freq": 1},
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path = tmp_path / "base.toml"
    path.write_text(dump_toml(config))
    return path


def _create(tmp_path: Path, base: Path, check: bool = False, sets: list[list[str]] = (), **options
            ) -> tuple[int, Path, dict]:
    """Sweep "s" of `base` into tmp_path/sweep over the `[lighthouse]` axes named in `options` (topk=[32, 64])
    and the `sets` axes ([key, TOML literal, ...]); the other options go to create_sweep as they are."""
    out = tmp_path / "sweep"
    axes = {name: options.pop(name) for name in LIGHTHOUSE_AXES if name in options}
    code = create_sweep(base, axes, [list(axis) for axis in sets], name="s", out=out, check_with_torchtitan=check,
                        **options)
    manifest = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).exists() else {}
    return code, out, manifest


def sweep_py(*argv: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python scripts/sweep.py <argv>` run in `cwd`, this checkout importable (`child_env` unless `env`)."""
    return run_python([str(REPO / "scripts" / "sweep.py"), *argv], cwd=cwd, env=env or child_env(), timeout=600)


# ------------------------------------------------------------------------------------------------- TOML
def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["int", "float", "bool", "str", "list", "inline"] if depth < 2 else ["int", "str", "float"])
    if kind == "int":
        return rng.randrange(-10**12, 10**12)
    if kind == "float":
        return rng.choice([rng.uniform(-1e3, 1e3), rng.uniform(0, 1) * 10.0 ** rng.randrange(-12, 12)])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "str":
        return "".join(rng.choice('ab "\\\n\t\x7f\u00e9\u4e2d\U0001f600/=[]#') for _ in range(rng.randrange(12)))
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randrange(1, 3))}


@pytest.mark.parametrize("seed", range(5), ids=lambda s: f"seed{s}")
def test_toml_writer_round_trips(seed):
    rng = random.Random(seed)
    config = {f"top{i}": _random_value(rng) for i in range(2)}
    for s in range(4):
        section = {rng.choice(["key", "with space", "dot.ted", "x-y_z"]) + str(i): _random_value(rng) for i in range(5)}
        if rng.random() < 0.5:
            section["sub"] = {"inner": _random_value(rng), "deeper": {"leaf": _random_value(rng)}}
        config[f"section{s}"] = section
    assert tomllib.loads(dump_toml(config, header="line one\nline two")) == config


def test_toml_writer_names_what_it_cannot_write():
    with pytest.raises(TypeError, match=r"cannot write set value \{1\}"):
        dump_toml({"a": {"b": {1}}})


# --------------------------------------------------------------------------------------------- create
def test_every_valid_point_is_written_and_every_invalid_one_reported(tmp_path, capsys):
    rng = random.Random(1)
    base = _base(tmp_path, rng)
    seq_len = tomllib.loads(base.read_text())["training"]["seq_len"]
    levels, pools, topks = [2, 3, 4, 5], [2, 4, 8], [32, 64, 128]
    code, out, manifest = _create(tmp_path, base, levels=levels, pool=pools, topk=topks)
    printed = capsys.readouterr().out
    assert code == 0
    written = {path.name for path in out.glob("*.toml")}
    expected_written, dump_folders = set(), set()
    for level, pool, topk in itertools.product(levels, pools, topks):
        label = f"L{level}-p{pool}-k{topk}"
        lighthouse = LighthouseConfig(levels=level, pool=pool, topk=topk, tile_budget=16, selection="paper")
        try:
            lighthouse.validate(seq_len)
        except ValueError as err:
            assert f"invalid  {label}  training.seq_len={seq_len}: {err}" in printed
            continue
        expected_written.add(f"s-{label}.toml")
        config = tomllib.loads((out / f"s-{label}.toml").read_text())
        assert (config["lighthouse"] | {"levels": level, "pool": pool, "topk": topk, "enable": True}
                == config["lighthouse"])
        assert config["job"]["description"] == f"s-{label}"
        assert f"S={lighthouse.gathered_len(seq_len)} of N={seq_len}" in printed
        dump_folders.add(config["job"]["dump_folder"])
        assert config["job"]["dump_folder"] == f"{tmp_path / 'outputs'}/s/{label}"
    assert written == expected_written and 0 < len(written) < len(levels) * len(pools) * len(topks)
    assert len(dump_folders) == len(written)
    assert len(manifest["points"]) == len(levels) * len(pools) * len(topks)
    assert sum(point["error"] is None for point in manifest["points"]) == len(written)


def test_generic_axes_and_scorers_make_distinct_names(tmp_path, capsys):
    base = _base(tmp_path, random.Random(2))
    code, out, manifest = _create(tmp_path, base, scorer=["norm", "dilated"], sets=[
        ["training.seq_len", "1024", "2048"], ["lighthouse.dense_layers", "[0, 1]", "[]"]])
    assert code == 0
    runs = [point["run"] for point in manifest["points"]]
    assert len(runs) == len(set(runs)) == 8
    assert "s-dilated-seq_len2048-dense_layers0-1" in runs
    config = tomllib.loads((out / "s-dilated-seq_len2048-dense_layers0-1.toml").read_text())
    assert (config["lighthouse"]["scorer"], config["training"]["seq_len"], config["lighthouse"]["dense_layers"]) == (
        "dilated", 2048, [0, 1])


def test_two_stage_points_resume_stage_one_with_dense_attention(tmp_path, capsys):
    rng = random.Random(3)
    base = _base(tmp_path, rng)
    steps, extra = tomllib.loads(base.read_text())["training"]["steps"], rng.randrange(5, 50)
    code, out, manifest = _create(tmp_path, base, topk=[32, 64], stage2_steps=extra)
    assert code == 0
    for point in manifest["points"]:
        stage1, stage2 = (tomllib.loads(Path(path).read_text()) for path in point["configs"])
        assert point["configs"][1].endswith(f"{point['run']}.stage2.toml")
        assert point["stage_steps"] == [steps, steps + extra]
        assert stage1["training"]["steps"] == steps and stage2["training"]["steps"] == steps + extra
        assert stage1["lr_scheduler"]["total_steps"] == stage2["lr_scheduler"]["total_steps"] == steps + extra
        assert stage1["lighthouse"]["enable"] is True and stage2["lighthouse"]["enable"] is False
        assert stage1["checkpoint"]["enable"] is stage2["checkpoint"]["enable"] is True
        assert stage1["checkpoint"]["last_save_model_only"] is False
        assert "last_save_model_only" not in stage2["checkpoint"]  # torchtitan's default, as in the base
        # stage 2 starts from stage 1's final full checkpoint, and keeps its own checkpoints apart
        folder = stage1["job"]["dump_folder"]
        assert point["dump_folders"] == [folder, f"{folder}.stage2"] == [stage1["job"]["dump_folder"],
                                                                        stage2["job"]["dump_folder"]]
        assert stage2["checkpoint"]["initial_load_path"] == f"{folder}/ckpt/step-{steps}"
        assert stage2["checkpoint"]["initial_load_model_only"] is False
        for stage in (stage1, stage2):
            del stage["job"]["description"], stage["job"]["dump_folder"], stage["lighthouse"]["enable"]
            del stage["training"]["steps"]
            for key in ("last_save_model_only", "initial_load_path", "initial_load_model_only"):
                stage["checkpoint"].pop(key, None)
        assert stage1 == stage2  # same schedule, data, model, everything else
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"slurm/submit.sh {out}/s-k32.toml {out}/s-k32.stage2.toml",
        f"slurm/submit.sh {out}/s-k64.toml {out}/s-k64.stage2.toml",
    ]


@pytest.mark.parametrize("sections,expected", [
    ({"lighthouse": {"switch_to_dense_at_step": 7}}, "switch_to_dense_at_step=7 and --stage2-steps=5 both"),
    ({"lr_scheduler": {"total_steps": 3}}, "[lr_scheduler] total_steps=3 differs from training.steps="),
], ids=["switch-step", "lr-total"])
def test_conflicting_stage_settings_are_reported_and_nothing_is_written(tmp_path, capsys, sections, expected):
    base = _base(tmp_path, random.Random(4), **sections)
    code, out, manifest = _create(tmp_path, base, topk=[32, 64], stage2_steps=5)
    printed = capsys.readouterr()
    assert code == 2 and printed.out.count(expected) == 2
    (line,) = printed.err.splitlines()
    assert line.startswith("sweep s: no valid point, nothing written: ") and expected in line
    assert line.endswith("(and 1 more point(s), listed above)")
    assert not out.exists()  # no sweep.json either: the corrected command runs without --force


def test_a_schedule_that_does_not_fit_names_the_stage2_steps_that_would(tmp_path, capsys):
    rng = random.Random(6)
    base = _base(tmp_path, rng)
    steps = tomllib.loads(base.read_text())["training"]["steps"]
    extra = rng.randrange(5, 50)
    base.write_text(base.read_text() + f"\n[lr_scheduler]\ntotal_steps = {steps + extra}\n")
    assert _create(tmp_path, base, topk=[32], stage2_steps=extra + 1)[0] == 2
    assert f"the base schedule fits --stage2-steps {extra}" in capsys.readouterr().out
    code, out, manifest = _create(tmp_path, base, topk=[32], stage2_steps=extra)
    assert code == 0 and manifest["points"][0]["stage_steps"] == [steps, steps + extra]


@pytest.mark.parametrize("grid,expected", [
    (dict(sets=[["training.seq_len", "4096", "big"]]), "training.seq_len='big' is a str, but the base config has"),
    (dict(topk=[32], sets=[["lighthouse.topk", "64"]]), "--set lighthouse.topk repeats an axis"),
    (dict(pool=[2, 2]), "lighthouse.pool lists a value twice: [2, 2]"),
    (dict(sets=[["seq_len", "4096"]]), "name a key as section.key"),
    ({}, "the grid is empty"),
    (dict(sets=[["model.flavor", "a/b", "a_b"]]), "two grid points got the same run name"),
], ids=["type", "repeat-axis", "repeat-value", "no-section", "empty", "name-clash"])
def test_bad_grids_fail_with_a_message_naming_them(tmp_path, grid, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        _create(tmp_path, _base(tmp_path, random.Random(5)), **grid)


def test_an_existing_sweep_is_not_overwritten(tmp_path):
    base = _base(tmp_path, random.Random(6))
    assert _create(tmp_path, base, topk=[32])[0] == 0
    with pytest.raises(ValueError, match="exists: pass --force"):
        _create(tmp_path, base, topk=[64])
    assert _create(tmp_path, base, topk=[64], force=True)[0] == 0


@needs_recipe
def test_torchtitan_parses_every_written_file_and_rejects_unknown_keys(tmp_path, capsys):
    base = _base(tmp_path, random.Random(7))
    code, out, manifest = _create(tmp_path, base, check=True, topk=[32], sets=[["training.warmup_stepz", "3"]])
    assert code == 2 and not out.exists()
    invalid = capsys.readouterr().out.splitlines()[-1]
    assert "torchtitan's parser rejected it" in invalid and "warmup_stepz" in invalid
    code, out, manifest = _create(tmp_path, base, check=True, topk=[32, 64], stage2_steps=4)
    assert code == 0 and len(list(out.glob("*.toml"))) == 4


def test_submit_chains_each_point(tmp_path):
    """--submit runs the printed submit.sh lines; a fake sbatch records what reached it."""
    work = tmp_path / "repo"
    shutil.copytree(REPO / "slurm", work / "slurm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/usr/bin/env bash\nn=$(ls "$FAKE_LOG" | wc -l)\n'
                                    'printf "%s\\n" "$@" > "$FAKE_LOG/$n"\necho $((500 + n))\n')
    (bin_dir / "sbatch").chmod(0o755)
    (tmp_path / "log").mkdir()
    base = _base(tmp_path, random.Random(8))
    env = {**child_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "log")}
    result = sweep_py("create", str(base), "--name", "s", "--topk", "32", "64", "--stage2-steps", "3", "--sbatch",
                      "--nodes=2 --time=1:00:00", "--submit", "--no-torchtitan-check", cwd=work, env=env)
    assert result.returncode == 0, result.stderr
    calls = [(tmp_path / "log" / str(n)).read_text().split("\n")[:-1] for n in range(4)]
    assert [call[1] for call in calls] == ["--job-name=s-k32", "--job-name=s-k32.stage2", "--job-name=s-k64",
                                          "--job-name=s-k64.stage2"]
    assert "--dependency=afterok:500" in calls[1] and "--dependency=afterok:502" in calls[3]
    assert all(call[-4:-1] == ["--nodes=2", "--time=1:00:00", "slurm/train.sbatch"] for call in calls)
    manifest = json.loads((work / "sweeps/s/sweep.json").read_text())
    assert [point["jobs"] for point in manifest["points"]] == ["500 501", "502 503"]


# -------------------------------------------------------------------------------------------- summary
def _write_tensorboard(folder: Path, segments: list[list[tuple[int, float, float]]], start: float) -> None:
    """One event file per process start; each point is (step, loss, tok/s)."""
    from torch.utils.tensorboard import SummaryWriter

    for index, segment in enumerate(segments):
        writer = SummaryWriter(str(folder / "tb" / f"2026010{index}-0000"))
        for step, loss, tps in segment:
            wall = start + 1000 * index + step
            writer.add_scalar(run_logs.LOSS_TAG, loss, step, walltime=wall)
            writer.add_scalar(run_logs.TPS_TAG, tps, step, walltime=wall)
        writer.close()


def _segments(rng: random.Random, stage1: int, total: int, cut: int) -> list[list[tuple[int, float, float]]]:
    """Stage 1 preempted after logging step `cut` and resumed from an earlier checkpoint (so steps up to
    `cut` are logged twice), then stage 2."""
    resume = rng.randrange(2, cut)

    def logged(first: int, last: int) -> list[tuple[int, float, float]]:
        return [(step, rng.uniform(0.5, 3.0), rng.uniform(1e4, 1e5)) for step in range(first, last + 1)]

    return [logged(1, cut), logged(resume, stage1), logged(stage1 + 1, total)]


def _after_first(segments: list[list[tuple[int, float, float]]]) -> list[float]:
    """The tok/s of every process start but its first logged step (start-up and compilation)."""
    return [tps for segment in segments for _, _, tps in segment[1:]]


def _float32(value: float) -> float:
    """What tensorboard gives back: scalars are stored as float32."""
    return float(np.float32(value))


def test_summary_reads_final_loss_and_per_stage_throughput(tmp_path, capsys):
    rng = random.Random(9)
    base = _base(tmp_path, rng, training={"steps": 12})
    code, out, manifest = _create(tmp_path, base, topk=[32, 64], stage2_steps=6)
    done, running = manifest["points"]
    done_segments = _segments(rng, 12, 18, cut=rng.randrange(4, 12))
    _write_tensorboard(Path(done["dump_folders"][0]), done_segments[:2], start=1.7e9)
    _write_tensorboard(Path(done["dump_folders"][1]), done_segments[2:], start=1.8e9)
    running_segments = _segments(rng, 12, 18, cut=12)[:2]  # stage 1 killed after its last log, then requeued
    _write_tensorboard(Path(running["dump_folders"][0]), running_segments, start=1.7e9)
    capsys.readouterr()
    assert print_summary([out], "json") == 0
    rows = json.loads(capsys.readouterr().out)

    assert rows[0]["run"] == "s-k32" and rows[0]["topk"] == 32 and rows[0]["S"] == done["gathered_len"]
    assert rows[0]["step"] == 18 and rows[0]["final_loss"] == _float32(done_segments[2][-1][1])
    assert rows[0]["tok_s_gpu"] == pytest.approx(statistics.median(_after_first(done_segments[:2])), rel=1e-6)
    assert rows[0]["dense_tok_s_gpu"] == pytest.approx(statistics.median(_after_first(done_segments[2:])), rel=1e-6)
    assert rows[0]["status"] == "done"
    # the last step was logged twice (before and after the requeue): the value written last counts
    assert running_segments[0][-1][0] == running_segments[1][-1][0] == 12
    assert rows[1]["step"] == 12 and rows[1]["final_loss"] == _float32(running_segments[1][-1][1])
    assert rows[1]["status"] == "at step 12/18" and rows[1]["dense_tok_s_gpu"] is None

    assert print_summary([out]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split("|")[1].strip() == "run" and len(table) == 4
    assert "| s-k32 " in table[2] and "| done " in table[2] and "at step 12/18" in table[3]


def test_summary_of_a_run_folder_reads_wandb_offline_runs(tmp_path, capsys):
    rng = random.Random(10)
    values = [(step, rng.uniform(0.5, 3.0), rng.uniform(1e3, 1e4)) for step in range(1, 1201)]
    script = (
        "import json, sys, wandb\n"
        "run = wandb.init(project='p', dir=sys.argv[1], mode='offline')\n"
        "for step, loss, tps in json.loads(sys.argv[2]):\n"
        f"    wandb.log({{'{run_logs.LOSS_TAG}': loss, '{run_logs.TPS_TAG}': tps}}, step=step)\n"
        "wandb.finish()\n"
    )
    folder = tmp_path / "run7" / "tb" / "20260101-0000"
    folder.mkdir(parents=True)
    env = {**os.environ, "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    subprocess.run([sys.executable, "-c", script, str(folder), json.dumps(values)], check=True, env=env, timeout=120)
    assert print_summary([tmp_path / "run7"], "json") == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["run"] == "run7" and row["step"] == 1200 and row["final_loss"] == values[-1][1]
    assert row["tok_s_gpu"] == statistics.median(tps for _, _, tps in values[1:])
    logs = run_logs.read_logs(tmp_path / "run7")  # the file spans many 32 KiB blocks; every point comes back
    assert [(p.step, p.value) for p in logs[0].scalars[run_logs.LOSS_TAG]] == [(s, loss) for s, loss, _ in values]


def test_summary_falls_back_to_metrics_jsonl(tmp_path, capsys):
    rng = random.Random(11)
    run = tmp_path / "run3"
    run.mkdir()
    first = [{"step": s, run_logs.LOSS_TAG: rng.random(), run_logs.TPS_TAG: rng.uniform(1, 9)} for s in range(1, 6)]
    second = [{"step": s, run_logs.LOSS_TAG: rng.random(), run_logs.TPS_TAG: rng.uniform(1, 9)} for s in range(4, 9)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first + second))
    assert print_summary([run], "csv") == 0
    header, line = capsys.readouterr().out.splitlines()
    row = dict(zip(header.split(","), line.split(",")))
    assert row["step"] == "8" and float(row["final_loss"]) == second[-1][run_logs.LOSS_TAG]
    tps = [r[run_logs.TPS_TAG] for r in first[1:] + second[1:]]
    assert float(row["tok_s_gpu"]) == statistics.median(tps)


def test_summary_of_nothing_is_an_error(tmp_path, capsys):
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert print_summary([empty]) == 1  # the table still shows the run folder without logs
    printed = capsys.readouterr()
    assert "| nothing | - " in printed.out and "no logs" in printed.out
    assert f"no run in {empty} has logged a step" in printed.err
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'typo'} does not exist")):
        print_summary([tmp_path / "typo"])
    base = _base(tmp_path, random.Random(12))
    assert _create(tmp_path, base, topk=[8])[0] == 2  # every point invalid: no sweep to summarize
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'sweep'} does not exist")):
        print_summary([tmp_path / "sweep"])
    _create(tmp_path, base, topk=[32])  # written, not started
    assert print_summary([tmp_path / "sweep"]) == 1
    assert "| s-k32 " in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- --local
STUB_TRAIN = """import json, os, sys
config = sys.argv[sys.argv.index("--job.config_file") + 1]
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(3 if os.path.basename(config) == os.environ.get("STUB_FAIL") else 0)
"""


def _stub_launcher(tmp_path: Path, monkeypatch, fail: str | None = None) -> tuple[str, Path]:
    """A launcher that logs the command line it gets, instead of training, and exits 3 on the config `fail`."""
    (tmp_path / "stub.py").write_text(STUB_TRAIN)
    monkeypatch.setenv("STUB_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("STUB_FAIL", fail or "")
    return f"{sys.executable} {tmp_path / 'stub.py'}", tmp_path / "calls.jsonl"


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_local_trains_every_stage_of_every_valid_point_in_order_and_records_it(tmp_path, monkeypatch, capsys):
    launcher, log = _stub_launcher(tmp_path, monkeypatch)
    base = _base(tmp_path, random.Random(13))
    code, out, manifest = _create(tmp_path, base, topk=[8, 32, 64], stage2_steps=3, local=True, launcher=launcher)
    assert code == 0
    stages = ["s-k32", "s-k32.stage2", "s-k64", "s-k64.stage2"]  # k=8 is invalid and not run
    assert _calls(log) == [[str(REPO / "train.py"), "--job.config_file", f"{out}/{name}.toml"] for name in stages]
    invalid, *points = manifest["points"]
    assert invalid["error"] is not None and invalid["local_runs"] is None
    for point in points:
        assert [run["config"] for run in point["local_runs"]] == point["configs"]
        assert all(run["exit_code"] == 0 and run["start"] <= run["end"] for run in point["local_runs"])
        assert point["jobs"] is None
    assert "submit.sh" not in capsys.readouterr().out


def test_local_stops_at_the_first_failing_stage_with_its_exit_code(tmp_path, monkeypatch, capsys):
    launcher, log = _stub_launcher(tmp_path, monkeypatch, fail="s-k32.stage2.toml")
    base = _base(tmp_path, random.Random(14))
    code, out, manifest = _create(tmp_path, base, topk=[32, 64], stage2_steps=3, local=True, launcher=launcher)
    assert code == 3
    assert [call[-1] for call in _calls(log)] == [f"{out}/s-k32.toml", f"{out}/s-k32.stage2.toml"]
    first, second = manifest["points"]
    assert [run["exit_code"] for run in first["local_runs"]] == [0, 3] and second["local_runs"] is None
    assert f"{out}/s-k32.stage2.toml failed (exit code 3)" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--launcher", "torchrun"], "--launcher 'torchrun' is used with --local only"),
    (["--local", "--submit"], "not allowed with argument"),
    (["--set", "training.seq_len", "4096", "big"], "sweep.py create: training.seq_len='big' is a str, but the base"),
], ids=["launcher-without-local", "local-and-submit", "bad-grid"])
def test_the_command_line_refuses_what_does_not_go_together_with_exit_code_2(tmp_path, flags, message, monkeypatch,
                                                                            capsys):
    code = script_exit_code("sweep.py", ["create", str(_base(tmp_path, random.Random(15))), "--topk", "32", "--out",
                                         str(tmp_path / "s"), *flags], monkeypatch)  # in this process: no start-up
    assert code == 2 and message in capsys.readouterr().err


def test_the_command_line_names_a_missing_path_in_one_line_with_exit_code_2(tmp_path):
    result = sweep_py("summary", str(tmp_path / "typo"))  # a fresh interpreter: nothing else on its stderr
    assert result.returncode == 2 and result.stderr == f"sweep.py summary: {tmp_path / 'typo'} does not exist\n"


@pytest.mark.slow
@needs_recipe
def test_a_local_sweep_trains_on_cpu_and_summary_reads_it(tmp_path):
    """Two points of the debug config, 2 steps each, trained here with the default launcher."""
    env = {key: value for key, value in child_env().items()
           if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}

    created = sweep_py("create", "configs/debug.toml", "--name", "cpu", "--out", str(tmp_path / "sweep"),
                       "--dump-root", str(tmp_path / "runs"), "--topk", "16", "32", "--set", "training.steps", "2",
                       "--local", env=env)
    assert created.returncode == 0, created.stderr[-3000:]
    summary = sweep_py("summary", str(tmp_path / "sweep"), "--format", "json", env=env)
    assert summary.returncode == 0, summary.stderr
    rows = json.loads(summary.stdout)
    assert [(row["run"], row["step"], row["status"]) for row in rows] == [("cpu-k16-steps2", 2, "done"),
                                                                          ("cpu-k32-steps2", 2, "done")]
    assert all(0 < row["final_loss"] < 10 for row in rows)


def test_create_and_summary_say_how_far_they_are_every_few_seconds_off_a_terminal(tmp_path, capsys, monkeypatch):
    ticks = iter(range(0, 10**6, 3))  # every clock reading 3 s after the one before: a slow machine

    class SlowLines(progress.ProgressLines):
        def __init__(self, total: int, desc: str) -> None:
            super().__init__(total, desc, every=5.0, clock=lambda: float(next(ticks)))

    monkeypatch.setattr(progress, "ProgressLines", SlowLines)
    base = _base(tmp_path, random.Random(3))
    code, out, manifest = _create(tmp_path, base, topk=[32, 64, 128], pool=[2, 4])
    err = capsys.readouterr().err.splitlines()
    assert code == 0 and err and err[-1] == f"sweep s: points checked: 6/6 (100%), {3 * 6} s"
    print_summary([out])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"sweep summary {out}: ")]
    written = sum(point["error"] is None for point in manifest["points"])
    assert lines and lines[-1].startswith(f"sweep summary {out}: runs read: {written}/{written} (100%), ")
