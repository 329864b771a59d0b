"""eval/studies/time_to_quality.py: arms assembled from their folders, training seconds by one rule, time to a loss."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.studies.time_to_quality import (arm_record, exchange_rates, load_arms, markdown_table, report_records,
                                         seconds_to_reach, step_seconds)

from .helpers import child_env
from .warm_python import run_python

STEP_TIME, DENSE_LOSS = "time_metrics/end_to_end(s)", "validation/dense_loss"
LIGHTHOUSE_LOSS = "validation/lighthouse_loss"


def write(folder: Path, records: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def steps(first: int, last: int, seconds: float, start: bool = True) -> list[dict]:
    """One process's step records, its first step slow (warm-up), preceded by its run-start marker."""
    marker = [{"event": "run_start", "step": first}] if start else []
    return marker + [{"step": s, STEP_TIME: 10.0 if s == first else seconds} for s in range(first, last + 1)]


def shadow(*pairs: tuple[int, float]) -> list[dict]:
    return [{"step": s, DENSE_LOSS: v} for s, v in pairs]


def test_the_first_step_of_every_process_counts_as_its_median_step():
    records = steps(1, 4, 0.5) + steps(5, 8, 0.25)  # a resumed second process
    assert step_seconds(records) == {**{s: 0.5 for s in range(1, 5)}, **{s: 0.25 for s in range(5, 9)}}


def test_a_switch_arm_is_its_stage_1_up_to_the_switch_then_its_stage_2(tmp_path):
    write(tmp_path / "dense_s0", steps(1, 8, 1.0) + shadow((1, 5.0), (4, 3.0), (8, 2.0)))
    write(tmp_path / "causal_s0", steps(1, 6, 0.5) + shadow((1, 5.0), (4, 3.5), (6, 3.0)))  # stage 1 to 6
    write(tmp_path / "causal_s0_switch4", steps(5, 8, 1.0) + shadow((8, 2.5)))
    write(tmp_path / "notes", [])  # not an arm
    arms = {a.name: a for a in load_arms(tmp_path)}
    assert set(arms) == {"dense_s0", "causal_s0_switch4"}
    arm = arms["causal_s0_switch4"]
    assert (arm.selection, arm.seed, arm.switch_step, arm.total_steps) == ("causal", 0, 4, 8)
    assert arm.train_seconds == pytest.approx(4 * 0.5 + 4 * 1.0)
    assert arm.curve == [(0.5, 5.0), (2.0, 3.5), (6.0, 2.5)]  # stage 1's step-6 point is not on this arm
    assert arm.median_step(lighthouse=True) == 0.5 and arm.median_step(lighthouse=False) == 1.0
    assert arms["dense_s0"].final_loss == 2.0


def run_record(folder: Path, lighthouse: str) -> None:
    """A run record in `folder` whose job has this `[lighthouse]` section."""
    record = folder / "runs" / "20260101-000000"
    record.mkdir(parents=True)
    (record / "config.toml").write_text(f"[training]\nseq_len = 64\n\n[lighthouse]\n{lighthouse}\n")


def test_each_record_names_its_stage_1_dense_layers_and_topk_from_the_run_record_and_a_dense_arm_neither(tmp_path):
    write(tmp_path / "dense_s0", steps(1, 8, 1.0) + shadow((1, 5.0), (4, 3.0), (8, 2.0)))
    run_record(tmp_path / "dense_s0", "enable = false\ntopk = 2048\ndense_layers = [0, 7]")
    write(tmp_path / "causal_s0_k4096", steps(1, 4, 0.5) + shadow((1, 5.0), (4, 3.5)))
    run_record(tmp_path / "causal_s0_k4096", "enable = true\ntopk = 4096\ndense_layers = [0, 7]")
    write(tmp_path / "causal_s0_k4096_switch4", steps(5, 8, 1.0) + shadow((8, 2.5)))  # stage 2: its stage 1 decides
    run_record(tmp_path / "causal_s0_k4096_switch4", "enable = true\ntopk = 16\ndense_layers = [1]")
    write(tmp_path / "causal_s1", steps(1, 4, 0.5) + shadow((1, 5.0), (4, 3.5)))  # logged before records were kept
    write(tmp_path / "causal_s1_switch4", steps(5, 8, 1.0) + shadow((8, 2.5)))
    arms = {a.name: a for a in load_arms(tmp_path)}
    dense = arms["dense_s0"]
    records = [arm_record(arm, dense, 64, "cpu") for arm in arms.values()]
    settings = {r["name"]: (r["dense_layers"], r["topk"], r["switch_step"]) for r in records}
    assert settings == {"dense": (None, None, None), "causal_s0_k4096_switch4": ([0, 7], 4096, 4),
                        "causal_s1_switch4": (None, None, 4)}


def started(folder: Path, start: str, commit: str, card: str | None = None) -> None:
    """A process start in `folder` whose run record names the tree `commit` (and the `card`, where given)."""
    record = folder / "runs" / start
    record.mkdir(parents=True)
    (record / "run.json").write_text(json.dumps({"start": start, "commit": commit, **({"card": card} if card else {})}))


def test_each_record_names_the_trees_that_trained_its_arm_and_the_given_commit_only_where_no_record_does(tmp_path):
    """A study's queue goes on over several allocations, each on the tree of its day: a report written on a later
    tree must not stamp that tree on runs trained before it."""
    write(tmp_path / "dense_s0", steps(1, 8, 1.0) + shadow((1, 5.0), (4, 3.0), (8, 2.0)))
    started(tmp_path / "dense_s0", "20261201-100000", "aaa1111")
    write(tmp_path / "causal_s0", steps(1, 4, 0.5) + shadow((1, 5.0), (4, 3.5)))
    started(tmp_path / "causal_s0", "20261201-110000", "aaa1111")
    write(tmp_path / "causal_s0_switch4", steps(5, 8, 1.0, start=False) + shadow((8, 2.5)))
    started(tmp_path / "causal_s0_switch4", "20261202-090000", "bbb2222")  # stage 2 on the next day's tree
    write(tmp_path / "dense_s1", steps(1, 8, 1.0) + shadow((1, 5.0), (8, 2.1)))  # logged before records were kept
    records = {r["name"]: r for r in report_records(load_arms(tmp_path), 64, "cpu", "ccc3333")}
    assert {n: (r["commit"], r.get("commits")) for n, r in records.items()} == {
        "dense": ("aaa1111", None), "causal_s0_switch4": ("bbb2222", ["aaa1111", "bbb2222"]),
        "dense_s1": ("ccc3333", None)}


def test_each_record_lists_the_cards_its_stage_1_and_stage_2_starts_recorded_and_none_where_none_did(tmp_path):
    """`cards` is what the run records say each process ran on, so a run resumed on another machine is seen to have
    changed card; `device` is the report's label, or those cards where none is given."""
    write(tmp_path / "dense_s0", steps(1, 8, 1.0) + shadow((1, 5.0), (8, 2.0)))
    started(tmp_path / "dense_s0", "20261201-100000", "aaa1111", "NVIDIA H200")
    started(tmp_path / "dense_s0", "20261201-110000", "aaa1111", "NVIDIA H200")  # resumed on the same card
    write(tmp_path / "causal_s0", steps(1, 4, 0.5) + shadow((1, 5.0), (4, 3.5)))
    started(tmp_path / "causal_s0", "20261201-120000", "aaa1111", "NVIDIA H200")
    write(tmp_path / "causal_s0_switch4", steps(5, 8, 1.0, start=False) + shadow((8, 2.5)))
    started(tmp_path / "causal_s0_switch4", "20261202-090000", "bbb2222", "NVIDIA H100 80GB HBM3")
    write(tmp_path / "dense_s1", steps(1, 8, 1.0) + shadow((1, 5.0), (8, 2.1)))
    started(tmp_path / "dense_s1", "20261201-100000", "aaa1111")  # a record written before cards were
    records = {r["name"]: r for r in report_records(load_arms(tmp_path), 64, "a label", "ccc3333")}
    assert {n: r.get("cards") for n, r in records.items()} == {
        "dense": ["NVIDIA H200"], "causal_s0_switch4": ["NVIDIA H200", "NVIDIA H100 80GB HBM3"], "dense_s1": None}
    assert {r["device"] for r in records.values()} == {"a label"}
    unlabelled = {r["name"]: r["device"] for r in report_records(load_arms(tmp_path), 64, None, "ccc3333")}
    assert unlabelled == {"dense": "NVIDIA H200", "causal_s0_switch4": "NVIDIA H200 + NVIDIA H100 80GB HBM3",
                          "dense_s1": "unknown"}, "without a label, each record's device is what its records name"


def test_exchange_rates_read_the_stage_1_and_final_losses_off_the_dense_curve_in_steps(tmp_path):
    # dense: 4.0 at step 2, 3.0 at 4, 2.0 at 8 (one second a step)
    write(tmp_path / "dense_s1", steps(1, 8, 1.0, start=False) + shadow((2, 4.0), (4, 3.0), (8, 2.0)))
    # stage 1 with every 4th step dense, to step 4: its weights score 3.5 under dense attention (dense reaches
    # that at step 3) and 2.9 under their own Lighthouse attention
    stage1 = steps(1, 4, 0.25, start=False) + shadow((2, 4.5), (4, 3.5)) + [{"step": 4, LIGHTHOUSE_LOSS: 2.9}]
    write(tmp_path / "causal_s1_every4", stage1)
    write(tmp_path / "causal_s1_every4_switch4", steps(5, 8, 1.0, start=False) + shadow((8, 2.5)))
    arms = {a.name: a for a in load_arms(tmp_path)}
    arm = arms["causal_s1_every4_switch4"]
    assert (arm.seed, arm.switch_step, arm.lighthouse_losses) == (1, 4, {4: 2.9})
    rates = exchange_rates(arm, arms["dense_s1"])
    assert rates["exchange_rate_at_switch"] == 3 / 4
    # dense reaches the final 2.5 at step 6; the arm's own 4 dense steps leave 2 for its 4 stage-1 steps
    assert rates["exchange_rate_landing"] == 2 / 4
    assert rates["shadow_minus_dense_at_switch"] == 0.5 and rates["shadow_minus_lighthouse_at_switch"] == 0.6
    assert rates["stage1_step_speedup"] == 4.0 and rates["stage1_mean_step_speedup"] == 4.0


def test_an_arm_with_unlogged_steps_is_rejected(tmp_path):
    write(tmp_path / "dense_s0", steps(1, 3, 1.0) + steps(5, 6, 1.0) + shadow((6, 2.0)))
    with pytest.raises(ValueError, match="steps 1..6 are not all logged"):
        load_arms(tmp_path)


@pytest.mark.parametrize("loss, expected", [(3.0, 15.0), (2.5, 20.0), (4.0, 0.0), (1.0, None)])
def test_seconds_to_reach_interpolates_between_validation_points(loss, expected):
    curve = [(0.0, 4.0), (10.0, 3.5), (20.0, 2.5), (30.0, 2.6)]
    assert seconds_to_reach(curve, loss) == expected


@pytest.mark.slow
def test_the_report_names_every_key_of_the_docs_layout_and_the_speedup(tmp_path):
    write(tmp_path / "run" / "dense_s0", steps(1, 8, 1.0) + shadow((1, 5.0), (4, 3.0), (8, 2.0)))
    write(tmp_path / "run" / "paper_s0", steps(1, 4, 0.5) + shadow((1, 5.0), (4, 3.5)))
    write(tmp_path / "run" / "paper_s0_switch4", steps(5, 8, 1.0) + shadow((8, 2.5)))
    run = run_python(["scripts/time_to_quality.py", "--run", str(tmp_path / "run"), "--out", str(tmp_path / "report"),
                      "--seq-len", "1024", "--device", "cpu", "--commit", "abc"], env=child_env(), timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    records = json.loads((tmp_path / "report.json").read_text())
    assert run.stdout == markdown_table(records) + "\n"
    assert (tmp_path / "report.png").stat().st_size > 0
    dense, paper = records
    keys = {"name", "selection", "switch_step", "total_steps", "seq_len", "seed", "device", "train_seconds",
            "final_heldout_loss", "curve"}
    assert keys <= set(dense) and keys <= set(paper) and dense["name"] == "dense"
    assert paper["curve"][-1] == [paper["train_seconds"], 2.5] == [6.0, 2.5]
    # dense passes 2.5 halfway between its step-4 (4 s, 3.0) and step-8 (8 s, 2.0) points: 6 s, as fast
    assert paper["dense_seconds_to_this_loss"] == 6.0 and paper["time_to_quality_speedup"] == 1.0
    assert paper["stage1_step_speedup"] == 2.0


def test_a_stage_2_that_trained_no_step_is_incomplete_not_an_arm_ending_at_its_switch(tmp_path):
    write(tmp_path / "dense_s0", steps(1, 8, 1.0) + shadow((1, 5.0), (4, 3.0), (8, 2.0)))
    write(tmp_path / "causal_s0", steps(1, 4, 0.5) + shadow((1, 5.0), (4, 3.5)))
    write(tmp_path / "causal_s0_switch4_rewarm2", [{"event": "run_start", "step": 5}])  # failed at its resume
    incomplete: list[str] = []
    assert [a.name for a in load_arms(tmp_path, incomplete)] == ["dense_s0"]
    assert incomplete == ["causal_s0_switch4_rewarm2"]
    with pytest.raises(ValueError, match="causal_s0_switch4_rewarm2"):
        load_arms(tmp_path)
