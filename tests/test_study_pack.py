"""What a study's run folder takes to another machine (`recipe.experiments.study_pack`, `payoff_map.py pack`): every
finished task's record, log and folder without checkpoints, and only the checkpoint steps an unfinished task reads;
a checkpoint over the size limit stays behind with the task that wrote it and every finished task that started
from that one."""
import json
import random
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from recipe.errors import ConfigError
from recipe.experiments.study_pack import missing_inputs, plan_pack, write_pack
from tests.helpers import REPO, child_env, script_exit_code
from tests.test_payoff_map import EXTENSION_EXAMPLE, example_study
from tests.warm_python import run_python


def fake_study(tmp_path: Path, finished: set[str]) -> Path:
    """A run folder whose queue trained `finished`: stage 0, a stage 1 and its stage 2 from it, a dense run from
    stage 0 and the per-token pass of the stage 2; each training folder holds its metrics and full step folders."""
    run = tmp_path / "run"
    tasks = {"stage0_s0": ("-", "train.py --job.dump_folder {run}/stage0_s0"),
             "causal_s0": ("stage0_s0", "train.py --checkpoint.initial_load_path {run}/stage0_s0/checkpoint/step-4"),
             "causal_s0_switch4": ("causal_s0",
                                   "train.py --checkpoint.initial_load_path={run}/causal_s0/checkpoint/step-4"),
             "anatomy_s0_0": ("causal_s0_switch4",
                              "loss_anatomy.py dump --out {run}/anatomy/s0_0 "
                              "--checkpoint causal_s0_switch4={run}/causal_s0_switch4/checkpoint/step-8"),
             "dense_s0": ("stage0_s0", "train.py --checkpoint.initial_load_path {run}/stage0_s0/checkpoint/step-4")}
    (run / "queue").mkdir(parents=True)
    (run / "tasks.tsv").write_text("".join(f"{n}\t{a}\t{c.format(run=run)}\n" for n, (a, c) in tasks.items()))
    for name in tasks:
        if name in finished:
            (run / "queue" / f"{name}.json").write_text(json.dumps(
                {"name": name, "returncode": 0, "command": tasks[name][1].format(run=run)}))
            (run / "queue" / f"{name}.log").write_text(f"{name} trained\n")
        if name.startswith("anatomy"):
            if name in finished:
                (run / "anatomy").mkdir(exist_ok=True)
                for suffix in (".npz", ".json"):
                    (run / "anatomy" / f"s0_0{suffix}").write_bytes(random.randbytes(64))
            continue
        folder = run / name
        (folder / "runs" / "20261202").mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": random.random()}) + "\n")
        for step, megabytes in ((4, 1.5), (8, 0.25)):
            step_folder = folder / "checkpoint" / f"step-{step}"
            step_folder.mkdir(parents=True)
            (step_folder / ".metadata").write_bytes(random.randbytes(16))
            (step_folder / "__0_0.distcp").write_bytes(random.randbytes(int(megabytes * 1e6)))
    return run


def members(pack: Path) -> set[str]:
    with tarfile.open(pack) as tar:
        return {m.name for m in tar.getmembers() if m.isfile()}


def test_a_pack_holds_what_finished_and_only_the_checkpoints_that_what_is_left_reads(tmp_path):
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "causal_s0_switch4", "anatomy_s0_0"})
    plan = write_pack(run, tmp_path / "pack.tar.gz")
    assert plan["finished"] == ["stage0_s0", "causal_s0", "causal_s0_switch4", "anatomy_s0_0"]
    assert plan["checkpoints"] == [run / "stage0_s0" / "checkpoint" / "step-4"] and plan["left_out"] == {}
    packed = members(tmp_path / "pack.tar.gz")
    for name in plan["finished"]:
        assert {f"queue/{name}.json", f"queue/{name}.log"} <= packed
    for name in ("stage0_s0", "causal_s0", "causal_s0_switch4"):
        assert f"{name}/metrics.jsonl" in packed
    assert {"anatomy/s0_0.npz", "anatomy/s0_0.json", "stage0_s0/checkpoint/step-4/.metadata",
            "stage0_s0/checkpoint/step-4/__0_0.distcp"} <= packed
    assert not [m for m in packed if "checkpoint" in m and not m.startswith("stage0_s0/checkpoint/step-4/")]
    assert not [m for m in packed if m.startswith(("dense_s0", "queue/dense_s0"))], "what did not finish stays"


def test_a_stage_2_left_to_train_takes_its_stage_1_step_and_a_pass_left_to_run_its_model(tmp_path):
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "causal_s0_switch4", "dense_s0"})
    assert plan_pack(run)["checkpoints"] == [run / "causal_s0_switch4" / "checkpoint" / "step-8"]
    run = fake_study(tmp_path / "b", {"stage0_s0", "causal_s0"})
    assert plan_pack(run)["checkpoints"] == [run / "causal_s0" / "checkpoint" / "step-4",
                                             run / "stage0_s0" / "checkpoint" / "step-4"]


def test_a_checkpoint_over_the_limit_stays_behind_with_its_task_and_what_started_from_it(tmp_path):
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "causal_s0_switch4", "anatomy_s0_0"})
    plan = write_pack(run, tmp_path / "pack.tar.gz", max_mb=1.0)  # stage 0's step-4 holds 1.5 MB
    assert plan["finished"] == [] and plan["checkpoints"] == []
    assert plan["left_out"] == {"stage0_s0": "stage0_s0/checkpoint/step-4 holds 1.5 MB, over 1",
                                "causal_s0": "it started from stage0_s0, left out",
                                "causal_s0_switch4": "it started from causal_s0, left out",
                                "anatomy_s0_0": "it started from causal_s0_switch4, left out"}
    assert members(tmp_path / "pack.tar.gz") == set()
    assert write_pack(run, tmp_path / "big.tar.gz", max_mb=2.0)["left_out"] == {}


def test_a_checkpoint_that_is_not_complete_is_not_taken_and_its_task_trains_again(tmp_path):
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0"})
    (run / "causal_s0" / "checkpoint" / "step-4" / ".metadata").unlink()
    plan = plan_pack(run)
    assert plan["finished"] == ["stage0_s0"] and plan["checkpoints"] == [run / "stage0_s0" / "checkpoint" / "step-4"]
    assert plan["left_out"] == {"causal_s0": "causal_s0/checkpoint/step-4 is not a complete checkpoint"}


def stopped_part_way(run: Path, name: str, whole: tuple[int, ...], partial: int) -> None:
    """`name` was stopped: its step folders `whole` were saved whole (manifest written), `partial` was cut off."""
    shutil.rmtree(run / name / "checkpoint")
    for step in (*whole, partial):
        folder = run / name / "checkpoint" / f"step-{step}"
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(random.randbytes(16))
        (folder / "__0_0.distcp").write_bytes(random.randbytes(500_000))
        if step in whole:
            (folder / "manifest.json").write_text("{}")
    command = next(line.split("\t")[2] for line in (run / "tasks.tsv").read_text().splitlines()
                   if line.startswith(f"{name}\t"))
    (run / "queue" / f"{name}.json").write_text(json.dumps({"name": name, "returncode": 143, "command": command,
                                                            "stopped": True}))
    (run / "queue" / f"{name}.log").write_text(f"{name} stopped\n")


def test_a_task_stopped_part_way_goes_with_its_latest_whole_step_and_reads_nothing_else(tmp_path):
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "causal_s0_switch4", "anatomy_s0_0"})
    stopped_part_way(run, "dense_s0", whole=(2, 6), partial=7)
    plan = write_pack(run, tmp_path / "pack.tar.gz")
    assert plan["resumed"] == {"dense_s0": run / "dense_s0" / "checkpoint" / "step-6"}
    assert plan["checkpoints"] == [run / "dense_s0" / "checkpoint" / "step-6"], "stage 0's step is not read again"
    assert plan["finished"] == ["stage0_s0", "causal_s0", "causal_s0_switch4", "anatomy_s0_0"]
    packed = members(tmp_path / "pack.tar.gz")
    assert {"dense_s0/metrics.jsonl", "queue/dense_s0.log", "dense_s0/checkpoint/step-6/manifest.json",
            "dense_s0/checkpoint/step-6/__0_0.distcp"} <= packed
    assert not [m for m in packed if m.startswith(("dense_s0/checkpoint/step-2", "dense_s0/checkpoint/step-7",
                                                   "stage0_s0/checkpoint"))]


def test_a_stopped_task_whose_step_is_over_the_limit_trains_again_whole_from_its_parent(tmp_path):
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "causal_s0_switch4", "anatomy_s0_0"})
    stopped_part_way(run, "dense_s0", whole=(6,), partial=7)
    plan = plan_pack(run, max_mb=0.4)  # its step holds 0.5 MB; stage 0's 1.5 MB is over too
    assert plan["resumed"] == {} and "dense_s0" in plan["left_out"]
    assert plan["left_out"]["dense_s0"] == "dense_s0/checkpoint/step-6 holds 0.5 MB, over 0.4: trains again whole"
    assert plan["left_out"]["stage0_s0"] == "stage0_s0/checkpoint/step-4 holds 1.5 MB, over 0.4"
    plan = plan_pack(run, max_mb=0.45)
    assert plan["resumed"] == {} and plan["finished"] == [] and plan["checkpoints"] == []


def test_a_stopped_task_whose_parent_trains_again_trains_again_whole_after_it(tmp_path):
    """The dense run stopped part-way started from stage 0; stage 0 has to train again (the step the stage 1 left
    to train reads is not whole), so the dense run goes back to its start rather than resume on top of other
    weights."""
    run = fake_study(tmp_path, {"stage0_s0"})
    stopped_part_way(run, "dense_s0", whole=(6,), partial=7)
    assert plan_pack(run)["resumed"] == {"dense_s0": run / "dense_s0" / "checkpoint" / "step-6"}
    (run / "stage0_s0" / "checkpoint" / "step-4" / ".metadata").unlink()
    plan = plan_pack(run)
    assert plan["resumed"] == {} and plan["finished"] == [] and plan["checkpoints"] == []
    assert plan["left_out"] == {"stage0_s0": "stage0_s0/checkpoint/step-4 is not a complete checkpoint",
                                "dense_s0": "it started from stage0_s0, left out"}

def test_a_finished_task_whose_step_a_task_left_reads_did_not_come_trains_again(tmp_path):
    """A pack carried without stage 0's weights (to fit a size limit): a run left to train from them makes stage 0
    train again; a run that resumes its own step reads nothing else."""
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "causal_s0_switch4", "anatomy_s0_0"})
    stopped_part_way(run, "dense_s0", whole=(6,), partial=7)
    shutil.rmtree(run / "stage0_s0" / "checkpoint")
    assert missing_inputs(run) == {}
    shutil.rmtree(run / "dense_s0" / "checkpoint")
    assert missing_inputs(run) == {"stage0_s0": "dense_s0 reads stage0_s0/checkpoint/step-4, which is not here"}


def test_a_stage_0_left_behind_goes_without_its_weights_and_keeps_its_record(tmp_path):
    run = fake_study(tmp_path, {"stage0_s0"})
    stopped_part_way(run, "dense_s0", whole=(6,), partial=7)
    plan = write_pack(run, tmp_path / "pack.tar.gz", behind=frozenset({"stage0_s0"}))
    assert plan["finished"] == ["stage0_s0"] and plan["left_out"] == {}
    assert plan["checkpoints"] == [run / "dense_s0" / "checkpoint" / "step-6"], "causal_s0 would read stage 0's"
    assert "queue/stage0_s0.json" in members(tmp_path / "pack.tar.gz")


def test_a_task_an_earlier_queue_of_the_folder_finished_goes_along_though_the_last_queue_does_not_name_it(tmp_path):
    """`run --only A`, then `run --only B` in the same folder: the pack holds A's records too (they were dropped
    unsaid); a task an earlier queue stopped part-way and the last one does not name is named as left behind."""
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "causal_s0_switch4", "anatomy_s0_0"})
    stopped_part_way(run, "dense_s0", whole=(6,), partial=7)
    last_queue = [line for line in (run / "tasks.tsv").read_text().splitlines() if line.startswith("stage0_s0\t")]
    (run / "tasks.tsv").write_text("\n".join(last_queue) + "\n")
    plan = write_pack(run, tmp_path / "pack.tar.gz")
    assert plan["finished"] == ["stage0_s0", "anatomy_s0_0", "causal_s0", "causal_s0_switch4"]
    assert plan["checkpoints"] == [] and plan["resumed"] == {}
    assert plan["left_out"] == {"dense_s0": "not in the queue of the last `run` (tasks.tsv), stopped part-way"}
    packed = members(tmp_path / "pack.tar.gz")
    assert {"queue/causal_s0_switch4.json", "causal_s0_switch4/metrics.jsonl", "anatomy/s0_0.npz"} <= packed
    assert not any(name.startswith("dense_s0/") for name in packed)


def test_without_stage0_needs_a_deterministic_stage_0_and_is_for_pack_alone(tmp_path, monkeypatch, capsys):
    study = example_study(tmp_path, EXTENSION_EXAMPLE)
    fake_study(tmp_path, set())
    assert script_exit_code("payoff_map.py", ["pack", str(study), "--without-stage0"], monkeypatch) == 2
    assert "lacks study.stage0_deterministic = true" in capsys.readouterr().err
    assert script_exit_code("payoff_map.py", ["tasks", str(study), "--without-stage0"], monkeypatch) == 2
    assert "--without-stage0 is for pack, not tasks" in capsys.readouterr().err


def test_pack_where_no_queue_ran_with_a_limit_below_zero_or_into_a_folder_is_one_line_and_exit_2(tmp_path, monkeypatch,
                                                                                                 capsys):
    study = example_study(tmp_path, EXTENSION_EXAMPLE)
    assert script_exit_code("payoff_map.py", ["pack", str(study)], monkeypatch) == 2
    assert f"{tmp_path / 'run'}: no tasks.tsv, so no queue ran there to pack" in capsys.readouterr().err
    fake_study(tmp_path, set())  # the study's run folder, now with a queue
    for limit in ("-1", "0", "nan"):  # was: NaN packed every checkpoint, no size being over it
        assert script_exit_code("payoff_map.py", ["pack", str(study), "--max-mb", limit], monkeypatch) == 2
        assert f"--max-mb {float(limit):g} must be above 0" in capsys.readouterr().err
    folder = tmp_path / "packs"
    folder.mkdir()
    assert script_exit_code("payoff_map.py", ["pack", str(study), "--out", str(folder)], monkeypatch) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --out {folder} is a folder: pack writes one .tar.gz file"]


@pytest.mark.parametrize("task", ["causal_s0", "dense_s0"], ids=["in-the-last-queue", "from-an-earlier-queue"])
def test_pack_names_an_exit_record_the_queue_did_not_write_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys,
                                                                                  task):
    study = example_study(tmp_path, EXTENSION_EXAMPLE)
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "dense_s0"})
    if task == "dense_s0":  # the last queue names stage 0 alone
        (run / "tasks.tsv").write_text((run / "tasks.tsv").read_text().splitlines()[0] + "\n")
    record = run / "queue" / f"{task}.json"
    record.write_text(record.read_text()[:random.randrange(1, 20)])
    assert script_exit_code("payoff_map.py", ["pack", str(study), "--out", str(tmp_path / "p.tar.gz")],
                            monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {record}: not a queue exit record (")
    assert not (tmp_path / "p.tar.gz").exists()


def test_every_reader_of_the_queue_records_names_one_the_queue_did_not_write_as_a_config_error(tmp_path):
    """`run` (what it trains again), `pack` and `report` (the queue commands of a record) read the same records: a
    damaged one is a ConfigError, which every command line prints as one line with exit 2."""
    run = fake_study(tmp_path, {"stage0_s0", "causal_s0", "dense_s0"})
    record = run / "queue" / "causal_s0.json"
    record.write_text(record.read_text()[:random.randrange(1, 20)])
    queue_commands = runpy.run_path(str(REPO / "scripts" / "payoff_map.py"))["queue_commands"]
    readers = [lambda: missing_inputs(run), lambda: plan_pack(run),
               lambda: queue_commands(run, {"name": "causal_s0_switch4", "seed": 0, "switch_step": 4})]
    for read in readers:
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(record))}: not a queue exit record \("):
            read()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # one seed of the CPU extension example, trained once and its last tasks again
def test_a_queue_packed_part_way_continues_elsewhere_training_only_what_was_left_and_the_same_runs(tmp_path):
    """The CPU extension example (one seed, arm-first) trains whole; its last tasks are then taken as unfinished (a
    lease that ended there), the run folder is packed, removed and unpacked, and `run` trains those tasks alone,
    from the packed stage 0, to the same losses (a CPU trains bit for bit)."""
    study = example_study(tmp_path, EXTENSION_EXAMPLE, seeds=[0])
    env = child_env()
    run = lambda *argv: run_python(["scripts/payoff_map.py", *argv, str(study)], env=env, timeout=900)  # noqa: E731
    trained = run("run", "--order", "arm-first")
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    folder = tmp_path / "run"
    names = [line.split("\t")[0] for line in (folder / "tasks.tsv").read_text().splitlines()]
    first_pass = next(i for i, name in enumerate(names) if name.startswith("anatomy_"))  # the Lighthouse arm's
    left = names[first_pass + 1:]
    assert left[0] == "dense_s0" and "dense_s0_steps4" in left
    aside = tmp_path / "left"  # a lease that ended before they started leaves neither their records nor folders
    aside.mkdir()
    for name in left:
        (folder / "queue" / f"{name}.json").unlink()
        if (folder / name).is_dir():
            (folder / name).rename(aside / name)
    packed = run("pack", "--out", str(tmp_path / "pack.tar.gz"))
    assert packed.returncode == 0, packed.stderr[-3000:]
    assert "4 finished tasks, 1 checkpoints (stage0_s0/checkpoint/step-4)" in packed.stdout
    first = tmp_path / "first"
    folder.rename(first)
    folder.mkdir()
    with tarfile.open(tmp_path / "pack.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    again = run("run", "--order", "arm-first")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    ran = [line.split()[1] for line in again.stdout.splitlines() if line.startswith("[queue]") and "exit" in line]
    assert ran == left, "only what was left trains, in its order"
    assert len(list((folder / "stage0_s0" / "runs").iterdir())) == 1, "stage 0 is not trained again"
    for name in left:
        if name.startswith("anatomy"):
            dump = f"{name.removeprefix('anatomy_')}.npz"
            for key, losses in np.load(first / "anatomy" / dump).items():
                assert np.array_equal(np.load(folder / "anatomy" / dump)[key], losses)
        else:
            assert validated(folder / name) == validated(aside / name), name
    reported = run("report", "--device", "cpu")
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert json.loads((folder / "report" / "payoff.json").read_text())["summary"]["incomplete"] == []


def validated(folder: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["validation/dense_loss"] for r in rows if "validation/dense_loss" in r}


@pytest.mark.slow
@pytest.mark.timeout(900)  # one seed's stage 0, dense and frontier runs, then the same stopped and continued
def test_a_queue_stopped_mid_run_packs_that_run_and_it_resumes_elsewhere_to_the_uninterrupted_losses(tmp_path):
    """SIGTERM to `payoff_map.py run` (a lease's or a job's end) while the dense run trains: that run saves the step
    it is on and the queue stops. Packed without stage 0's weights, removed and unpacked, `run` trains stage 0 again
    (the frontier run left reads it), resumes the dense run at its step and trains the frontier run: all three end
    with the losses of the same queue run without a stop (a CPU trains bit for bit)."""
    only = ["--only", "stage0_s0,dense_s0,dense_s0_steps16", "--order", "arm-first"]
    longer = {"seeds": [0], "stage0_deterministic": True, "steps": 32, "warmup_steps": 4, "frontier": [16]}
    (tmp_path / "whole").mkdir()
    whole = example_study(tmp_path / "whole", EXTENSION_EXAMPLE, **longer)
    env = child_env()
    trained = run_python(["scripts/payoff_map.py", "run", str(whole), *only], env=env, timeout=600)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]

    study = example_study(tmp_path, EXTENSION_EXAMPLE, **longer)
    folder = tmp_path / "run"
    queue = subprocess.Popen([sys.executable, "scripts/payoff_map.py", "run", str(study), *only], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    while not trained_a_step(folder / "dense_s0") and queue.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    queue.send_signal(signal.SIGTERM)  # passed on at once: the run stops after the step it is on, of 32
    out, _ = queue.communicate(timeout=300)
    assert queue.returncode == 1 and "stopping, it got SIGTERM: SIGTERM to dense_s0; 1 not started" in out, out[-3000:]
    stopped = json.loads((folder / "queue" / "dense_s0.json").read_text())
    assert stopped["returncode"] == 143 and stopped["stopped"], stopped
    packed = run_python(["scripts/payoff_map.py", "pack", str(study), "--out", str(tmp_path / "pack.tar.gz"),
                         "--without-stage0"], env=env, timeout=300)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    assert "1 finished tasks, dense_s0 resumes at dense_s0/checkpoint/step-" in packed.stdout
    assert "packed without their weights (trained again where a run left needs them): stage0_s0" in packed.stdout
    assert not [m for m in members(tmp_path / "pack.tar.gz") if m.startswith("stage0_s0/checkpoint")]
    folder.rename(tmp_path / "first")
    folder.mkdir()
    with tarfile.open(tmp_path / "pack.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    (folder / "corpus").symlink_to(tmp_path / "first" / "corpus")
    again = run_python(["scripts/payoff_map.py", "run", str(study), *only], env=env, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    why = "dense_s0_steps16 reads stage0_s0/checkpoint/step-4, which is not here"
    assert f"stage0_s0 trains again: {why}" in again.stdout
    ran = [line.split()[1] for line in again.stdout.splitlines() if line.startswith("[queue]") and "exit" in line]
    assert ran == ["stage0_s0", "dense_s0", "dense_s0_steps16"]
    assert len(list((folder / "dense_s0" / "runs").iterdir())) == 2, "the dense run resumed: two process starts"
    assert json.loads((folder / "queue" / "dense_s0.json").read_text())["queues"] == [
        shlex.join(["scripts/payoff_map.py", "run", str(study), *only])], "both queues, the same command, named once"
    assert f"Loading the checkpoint from {folder}/dense_s0/checkpoint/step-" in (folder / "queue" / "dense_s0.log"
                                                                                 ).read_text(), "its own step"
    for name in ("stage0_s0", "dense_s0", "dense_s0_steps16"):
        continued, uninterrupted = losses(folder / name), losses(tmp_path / "whole" / "run" / name)
        assert continued and continued == uninterrupted, name

def trained_a_step(folder: Path) -> bool:
    metrics = folder / "metrics.jsonl"
    return metrics.is_file() and '"step": 1,' in metrics.read_text()


def losses(folder: Path) -> dict[tuple[int, str], float]:
    """Every loss a run folder logged, by step and metric, the last record of a step winning (a resumed run logs
    again the steps after its saved one)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], key): value for r in rows if "step" in r for key, value in r.items() if "loss" in key}
