"""Loss by position in a context-extension study (eval/studies/loss_by_position.py): every model's mean loss per
position class and past stage 0, and each Lighthouse arm against its seed's dense frontier of each class at the
arm's dense-equivalent steps."""
from __future__ import annotations

import numpy as np
import pytest

from eval.studies import loss_by_position

LENGTHS = (400, 510, 600, 720)  # the seed's dense runs: the frontier, the study's own length last
STAGE0 = 64
T = 256


def dense_record(seed: int, steps: int) -> dict:
    name = ("dense" if seed == 0 else f"dense_s{seed}") if steps == LENGTHS[-1] else f"dense_s{seed}_steps{steps}"
    return {"name": name, "selection": "dense", "seed": seed, "total_steps": steps,
            "final_heldout_loss": 3.0 - steps / 1000, "train_seconds": 0.7 * steps}


def arm_record(seed: int, equivalent: float) -> dict:
    """A Lighthouse arm of 720 steps (switch 360) whose stage-2 steps take 0.7 s: `equivalent` dense-equivalent
    steps."""
    seconds = 0.7 * equivalent
    return {"name": f"causal_s{seed}_switch360", "selection": "causal", "seed": seed, "switch_step": 360,
            "total_steps": 720, "final_heldout_loss": 2.4, "train_seconds": seconds,
            "curve": [[0.0, 3.0], [seconds - 252.0, 2.6], [seconds, 2.4]],
            "step_curve": [[1, 3.0], [360, 2.6], [720, 2.4]]}


def study(rng: np.random.Generator, equivalents: dict[int, float]) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Per seed, the four dense runs and an arm at its dense-equivalent steps, each with random per-token losses
    [2 windows, T]."""
    records, losses = [], {}
    for seed, equivalent in equivalents.items():
        records += [dense_record(seed, n) for n in LENGTHS] + [arm_record(seed, equivalent)]
        for name in [f"dense_s{seed}", *(f"dense_s{seed}_steps{n}" for n in LENGTHS[:-1]), f"causal_s{seed}_switch360"]:
            losses[name] = rng.uniform(1.0, 4.0, size=(2, T)).astype(np.float32)
    return records, losses


def class_mean(loss: np.ndarray, cls: str) -> float:
    """The mean of the positions the class's name bounds (`64-256`), or of those >= stage 0's length."""
    low, high = (STAGE0, T) if cls == loss_by_position.PAST else map(int, cls.split("-"))
    return float(loss[:, low:high].astype(np.float64).mean())


def test_each_model_has_its_mean_loss_in_every_position_class_split_at_stage_0s_length_and_past_stage_0():
    rng = np.random.default_rng()
    records, losses = study(rng, {0: rng.uniform(400, 720)})
    read = loss_by_position.read_out(records, loss_by_position.model_class_losses(losses, STAGE0), STAGE0, 60, 4)
    assert read["classes"] == ["0-64", "64-256", "past stage 0"]
    assert set(read["models"][0]) == set(losses), "seed 0's dense run (record `dense`) is its folder dense_s0"
    for name, classes in read["models"][0].items():
        assert classes == {cls: pytest.approx(class_mean(losses[name], cls)) for cls in read["classes"]}


def test_an_arms_class_difference_is_its_class_loss_minus_that_classs_frontier_linear_at_its_dense_equivalent_steps():
    rng = np.random.default_rng()
    equivalents = {seed: rng.uniform(400, 720) for seed in (0, 1, 2)}
    records, losses = study(rng, equivalents)
    read = loss_by_position.read_out(records, loss_by_position.model_class_losses(losses, STAGE0), STAGE0, 60, 4)
    arm = read["arms"]["causal_switch360"]
    for seed, equivalent in equivalents.items():
        row = arm["seeds"][seed]
        assert row["dense_equivalent_steps"] == pytest.approx(equivalent)
        for cls in read["classes"]:
            front = [class_mean(losses[f"dense_s{seed}" if n == 720 else f"dense_s{seed}_steps{n}"], cls)
                     for n in LENGTHS]
            frontier = float(np.interp(equivalent, LENGTHS, front))
            arm_loss = class_mean(losses[f"causal_s{seed}_switch360"], cls)
            assert row["classes"][cls]["frontier"] == pytest.approx(frontier)
            assert row["classes"][cls]["difference"] == pytest.approx(arm_loss - frontier)
    for cls in read["classes"]:
        diffs = [arm["seeds"][s]["classes"][cls]["difference"] for s in equivalents]
        assert arm["matched_compute"][cls]["mean_difference"] == pytest.approx(np.mean(diffs), abs=5e-5)
        assert arm["matched_compute"][cls]["below_zero"] == sum(d < 0 for d in diffs)
        low, high = arm["matched_compute"][cls]["interval95"]
        assert low <= np.mean(diffs) <= high


def test_outside_the_frontiers_lengths_an_arm_has_no_class_difference_and_is_left_out_of_the_mean():
    rng = np.random.default_rng()
    records, losses = study(rng, {0: rng.uniform(300, 399), 1: rng.uniform(400, 720)})
    read = loss_by_position.read_out(records, loss_by_position.model_class_losses(losses, STAGE0), STAGE0, 60, 4)
    arm = read["arms"]["causal_switch360"]
    assert all(c["frontier"] is None and c["difference"] is None for c in arm["seeds"][0]["classes"].values())
    for cls in read["classes"]:
        assert arm["matched_compute"][cls]["n"] == 1
        assert arm["matched_compute"][cls]["mean_difference"] == pytest.approx(
            arm["seeds"][1]["classes"][cls]["difference"], abs=5e-5)
    row = next(line for line in loss_by_position.markdown(read).splitlines()
               if line.startswith("| causal_switch360 | past stage 0 |"))
    past = arm["seeds"][1]["classes"]["past stage 0"]["difference"]
    assert row.split(" | ")[2:4] == ["0,1", f"- {past:+.3f}"], "seed 0's difference is reported as -"


def test_a_seed_whose_scored_dense_runs_lack_a_length_has_no_frontier():
    rng = np.random.default_rng()
    records, losses = study(rng, {0: rng.uniform(400, 720), 1: rng.uniform(400, 720)})
    del losses["dense_s1_steps510"]
    read = loss_by_position.read_out(records, loss_by_position.model_class_losses(losses, STAGE0), STAGE0, 60, 4)
    assert list(read["frontiers"]) == [0]
    assert all(c["difference"] is None for c in read["arms"]["causal_switch360"]["seeds"][1]["classes"].values())


def test_at_matched_steps_an_arm_is_its_class_loss_minus_its_seeds_dense_run_of_the_studys_length():
    rng = np.random.default_rng()
    records, losses = study(rng, {0: rng.uniform(400, 720), 3: rng.uniform(400, 720)})
    read = loss_by_position.read_out(records, loss_by_position.model_class_losses(losses, STAGE0), STAGE0, 60, 4)
    arm = read["arms"]["causal_switch360"]
    for cls in read["classes"]:
        minus = [class_mean(losses[f"causal_s{s}_switch360"], cls) - class_mean(losses[f"dense_s{s}"], cls)
                 for s in (0, 3)]
        assert [arm["seeds"][s]["classes"][cls]["minus_dense"] for s in (0, 3)] == pytest.approx(minus)
        assert arm["matched_steps"][cls] == {"n": 2, "mean_difference": pytest.approx(np.mean(minus), abs=5e-5)}


def test_models_scored_by_earlier_reports_join_by_their_records_class_losses_as_if_their_dumps_were_here():
    """A seed continued in a later allocation: its earlier models' dumps stay behind, their records carry the class
    losses that the earlier report took from them, and the read-out is the one all dumps give."""
    rng = np.random.default_rng()
    records, losses = study(rng, {0: rng.uniform(400, 720), 1: rng.uniform(400, 720)})
    everything = loss_by_position.read_out(records, loss_by_position.model_class_losses(losses, STAGE0), STAGE0, 60, 4)
    earlier = {n: losses.pop(n) for n in ["dense_s0", "dense_s0_steps400", "causal_s1_switch360"]}
    joined = {**loss_by_position.model_class_losses(earlier, STAGE0),
              **loss_by_position.model_class_losses(losses, STAGE0)}
    assert loss_by_position.read_out(records, joined, STAGE0, 60, 4) == everything


def test_models_whose_position_classes_differ_are_named_not_joined():
    rng = np.random.default_rng()
    records, losses = study(rng, {0: rng.uniform(400, 720)})
    scored = loss_by_position.model_class_losses(losses, STAGE0)
    scored["dense_s0_steps400"] = loss_by_position.model_class_losses({"x": losses["dense_s0_steps400"]}, 32)["x"]
    with pytest.raises(ValueError, match=r"different position classes: .*\['dense_s0_steps400'\] in \['0-32', "):
        loss_by_position.read_out(records, scored, STAGE0, 60, 4)
