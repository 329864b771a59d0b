"""Matched compute (eval/studies/frontier.py, `[study] frontier`): dense runs whose whole schedule ends sooner form each
seed's frontier, and a Lighthouse -> dense arm is placed on it by its own dense step time."""
from __future__ import annotations

import random
import shlex
from pathlib import Path

import pytest

from eval.studies import frontier
from eval.studies.time_to_quality import Arm, report_records, time_to_quality
from recipe.experiments.payoff_grid import load_study, plan_runs, scored_models, train_command

REPO = Path(__file__).resolve().parents[1]


def arm(name: str, seed: int, total: int, switch: int | None, step_seconds: tuple[float, float], freq: int,
        rng: random.Random) -> Arm:
    """An arm with random per-step times around (stage-1, dense) seconds and random losses on validated steps."""
    seconds = {s: (step_seconds[0] if switch and s <= switch else step_seconds[1]) * rng.uniform(0.9, 1.1)
               for s in range(1, total + 1)}
    validated = [1, *range(freq, total + 1, freq)]
    if validated[-1] != total:
        validated.append(total)
    losses = {s: 3.0 - s / total + rng.uniform(-0.01, 0.01) for s in validated}
    selection = "dense" if switch is None else "causal"
    return Arm(name, selection, seed, switch, total, seconds, losses)


def test_a_lighthouse_arm_counts_its_seconds_in_its_own_dense_steps_and_a_dense_run_in_its_steps():
    rng = random.Random(0)
    lighthouse = arm("causal_s0_switch40", 0, 80, 40, (0.3, 0.7), 10, rng)
    dense = arm("dense_s0", 0, 80, None, (0.7, 0.7), 10, rng)
    records = {r["name"]: r for r in report_records([lighthouse, dense], 1024, "cpu", "c0")}
    stage2_step = sum(lighthouse.seconds[s] for s in range(41, 81)) / 40
    assert frontier.dense_equivalent_steps(records["causal_s0_switch40"], 10) == pytest.approx(
        lighthouse.train_seconds / stage2_step, rel=1e-4)
    assert frontier.dense_equivalent_steps(records["dense"], 10) == 80


def test_an_older_record_without_step_curve_reads_its_steps_from_the_validation_frequency():
    rng = random.Random(1)
    record = report_records([arm("causal_s2_switch30", 2, 60, 30, (0.2, 0.5), 15, rng)], 1024, "cpu", "c0")[0]
    del record["step_curve"]
    assert frontier.validated_steps(record, 15) == [1, 15, 30, 45, 60]
    assert 30 < frontier.dense_equivalent_steps(record, 15) < 60  # stage-1 steps cost less than dense ones
    with pytest.raises(ValueError, match="curve points do not match"):
        frontier.validated_steps(record, 20)


FRONT = [{"steps": 400, "loss": 2.49}, {"steps": 510, "loss": 2.34}, {"steps": 600, "loss": 2.35},
         {"steps": 720, "loss": 2.24}]


@pytest.mark.parametrize("steps, loss", [(400, 2.49), (455, 2.415), (555, 2.345), (720, 2.24), (399, None),
                                         (721, None)], ids=lambda v: str(v))
def test_the_frontier_between_lengths_is_linear_and_undefined_outside_them(steps, loss):
    assert frontier.loss_at(FRONT, steps) == (None if loss is None else pytest.approx(loss))


@pytest.mark.parametrize("loss, steps, bound", [
    (2.50, 400, "below"),                                    # the shortest run is already there
    (2.415, 455, ""),                                        # between the first two lengths
    (2.342, 400 + 110 * (2.49 - 2.342) / (2.49 - 2.34), ""),  # first crossing, though 600 lies above it again
    (2.20, 720, "above"),                                    # never reached
], ids=["below", "between", "first-crossing", "above"])
def test_the_steps_to_reach_a_loss_are_the_first_crossing_with_bounds_outside(loss, steps, bound):
    assert frontier.steps_to_reach(FRONT, loss) == (pytest.approx(steps), bound)


def records_for(seed_diffs: dict[int, float]) -> list[dict]:
    """Per seed, a frontier of 400/510/600/720 steps at 0.7 s a step and a Lighthouse arm of 357 s whose stage-2
    steps take 0.7 s (so 510 dense-equivalent steps), ending at the frontier's loss there plus the difference."""
    records = []
    for seed, diff in seed_diffs.items():
        for steps, loss in ((400, 2.5), (510, 2.4), (600, 2.35), (720, 2.3)):
            name = f"dense_s{seed}" if steps == 720 else f"dense_s{seed}_steps{steps}"
            records.append({"name": name, "selection": "dense", "seed": seed, "total_steps": steps,
                            "final_heldout_loss": loss + 0.01 * seed, "train_seconds": steps * 0.7})
        records.append({"name": f"causal_s{seed}_switch360", "selection": "causal", "seed": seed,
                        "switch_step": 360, "total_steps": 720, "final_heldout_loss": 2.4 + 0.01 * seed + diff,
                        "train_seconds": 357.0, "curve": [[0.0, 3.0], [105.0, 2.6], [357.0, 2.4]],
                        "step_curve": [[1, 3.0], [360, 2.6], [720, 2.4]]})
    return records


@pytest.mark.parametrize("diffs, verdict", [
    ({0: -0.03, 1: -0.05, 2: -0.02}, "better at equal compute"),
    ({0: +0.03, 1: +0.01, 2: +0.02}, "worse at equal compute"),
    ({0: -0.03, 1: +0.04, 2: -0.01}, "not resolved"),
    ({0: -0.03}, "too few seeds"),
], ids=["better", "worse", "mixed", "one-seed"])
def test_each_arm_is_paired_with_its_seeds_frontier_at_equal_compute_and_judged_by_the_preregistered_rule(
        diffs, verdict):
    placed = frontier.place(records_for(diffs), 60, lengths=4)
    entry = placed["arms"]["causal_switch360"]
    assert [row["difference"] for row in entry["seeds"].values()] == pytest.approx(list(diffs.values()))
    assert all(row["dense_equivalent_steps"] == pytest.approx(510) for row in entry["seeds"].values())
    assert entry["verdict"] == verdict
    assert entry["below_zero"] == sum(d < 0 for d in diffs.values())
    assert frontier.markdown(placed).startswith("At equal GPU-seconds")


def arm_records(name: str, seed_diffs: dict[int, float]) -> list[dict]:
    """The Lighthouse records of `records_for`, renamed to the arm `name` (causal_s<seed>_<name suffix>)."""
    lighthouse = [r for r in records_for(seed_diffs) if r["selection"] == "causal"]
    return [{**r, "name": f"causal_s{r['seed']}_{name}"} for r in lighthouse]


@pytest.mark.parametrize("shift, verdict", [
    (-0.04, "better than causal_switch360 at equal compute"),
    (+0.04, "worse than causal_switch360 at equal compute"),
    (0.0, "not resolved"),
], ids=["better", "worse", "same"])
def test_an_arm_against_the_defaults_is_the_difference_of_their_paired_differences_judged_when_every_seed_is_placed(
        shift, verdict):
    rng = random.Random(3)
    base = {seed: rng.uniform(-0.06, 0.0) for seed in range(4)}
    noise = [0.01, -0.01, 0.02, -0.02] if shift == 0 else [rng.uniform(-0.005, 0.005) for _ in range(4)]
    other = {seed: base[seed] + shift + noise[seed] for seed in range(4)}
    records = records_for(base) + arm_records("dl0_switch360", other)
    placed = frontier.place(records, 60, lengths=4, baseline="causal_switch360", seeds=[0, 1, 2, 3])
    compared = placed["arms"]["causal_dl0_switch360"]["against_baseline"]
    assert compared["seeds"] == [0, 1, 2, 3]
    assert compared["differences"] == pytest.approx([other[s] - base[s] for s in range(4)], abs=2e-4)
    assert compared["verdict"] == verdict
    assert "against_baseline" not in placed["arms"]["causal_switch360"]
    assert "Against causal_switch360 at equal GPU-seconds" in frontier.markdown(placed)


def test_the_rule_against_the_defaults_is_not_read_while_a_seed_of_the_study_is_missing():
    records = records_for({0: -0.03, 1: -0.02, 2: -0.04}) + arm_records("dl0_switch360", {0: -0.09, 1: -0.08})
    placed = frontier.place(records, 60, lengths=4, baseline="causal_switch360", seeds=[0, 1, 2])
    compared = placed["arms"]["causal_dl0_switch360"]["against_baseline"]
    assert compared["seeds"] == [0, 1] and compared["interval95"] is not None
    assert compared["verdict"] == "not read: seeds [2] not placed"


@pytest.mark.parametrize("slower, warned", [(1.0, False), (1.019, False), (1.05, True), (3.0, True)],
                         ids=["steady", "1.9%", "5%", "3x"])
def test_a_report_whose_frontier_step_times_spread_beyond_2_percent_says_so_first(slower, warned):
    records = records_for({0: -0.02, 1: -0.03})
    for r in records:
        if r["name"] == "dense_s1_steps400":
            r["train_seconds"] *= slower
    placed = frontier.place(records, 60, lengths=4)
    assert placed["step_time_spread"] == pytest.approx(slower - 1, abs=1e-4)
    first = frontier.markdown(placed).splitlines()[0]
    assert first.startswith("**Time check failed**") is warned
    if warned:
        assert f"spread {slower - 1:.0%} (0.7-{0.7 * slower:.3g} s)" in first


@pytest.mark.parametrize("unsteady", [None, "card A", "card B"])
def test_the_time_check_compares_frontier_runs_within_each_card_model_and_names_the_card_it_fails_on(unsteady):
    """Seeds matched on their own card's frontier may run on cards of different speeds: the check is within each."""
    rng = random.Random()
    records = records_for({0: -0.02, 1: -0.03, 2: 0.01})
    speed = {0: "card A", 1: "card A", 2: "card B"}
    factor = {"card A": 1.0, "card B": rng.uniform(0.7, 0.9)}  # card B is faster by far more than 2%
    for r in records:
        r["device"] = speed[r["seed"]]
        r["train_seconds"] *= factor[r["device"]]
    slower = rng.uniform(1.03, 1.2)
    if unsteady is not None:
        seed = 0 if unsteady == "card A" else 2
        next(r for r in records if r["name"] == f"dense_s{seed}_steps510")["train_seconds"] *= slower
    placed = frontier.place(records, 60, lengths=4)
    first = frontier.markdown(placed).splitlines()[0]
    if unsteady is None:
        assert placed["step_time_spread"] == pytest.approx(0, abs=1e-4)
        assert first.startswith("At equal GPU-seconds")
        return
    assert placed["step_time_spread_card"] == unsteady
    assert placed["step_time_spread"] == pytest.approx(slower - 1, abs=2e-3)
    fastest, slowest = round(0.7 * factor[unsteady], 4), round(0.7 * factor[unsteady] * slower, 4)
    assert first.startswith(f"**Time check failed**: the frontier runs' seconds per step on {unsteady} spread "
                            f"{placed['step_time_spread']:.0%} ({fastest:.3g}-{slowest:.3g} s)")


def test_a_seed_whose_frontier_lacks_a_length_is_left_out():
    records = [r for r in records_for({0: -0.02, 1: -0.03}) if r["name"] != "dense_s1_steps510"]
    placed = frontier.place(records, 60, lengths=4)
    assert list(placed["arms"]["causal_switch360"]["seeds"]) == [0]
    assert list(placed["frontiers"]) == [0]


def test_a_frontier_run_is_never_taken_as_its_seeds_dense_reference():
    rng = random.Random(2)
    full = arm("dense_s0", 0, 40, None, (0.5, 0.5), 10, rng)
    arms = [full, arm("dense_s0_steps20", 0, 20, None, (0.5, 0.5), 10, rng),
            arm("causal_s0_switch20", 0, 40, 20, (0.2, 0.5), 10, rng)]
    records = {r["name"]: r for r in report_records(arms, 1024, "cpu", "c0")}
    lighthouse = records["causal_s0_switch20"]
    assert lighthouse["dense_seconds_to_this_loss"] == time_to_quality(
        full.curve, lighthouse["final_heldout_loss"], lighthouse["train_seconds"])["dense_seconds_to_this_loss"]
    assert "time_to_quality_speedup" not in records["dense_s0_steps20"]


def study_with(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(f"""[study]
config = "configs/time_to_quality/tiny_128k.toml"
run = "out"
corpus = "corpus"
steps = 720
warmup_steps = 72
seeds = [3, 4]
{extra}
[[grid]]
switch = [360]
""")
    return path


def test_frontier_runs_follow_each_seeds_dense_run_longest_first_with_the_schedule_scaled_to_their_length(tmp_path):
    study = load_study(study_with(tmp_path, 'frontier = [400, 600]\nreported = ["dense_s4_steps600"]'))
    runs = plan_runs(study)
    assert [(r.name, r.kind) for r in runs if r.kind != "stage1" and r.kind != "stage2"] == [
        ("dense_s3", "dense"), ("dense_s3_steps600", "frontier"), ("dense_s3_steps400", "frontier"),
        ("dense_s4", "dense"), ("dense_s4_steps400", "frontier")]
    assert scored_models(study, runs) == {3: {"dense_s3": 720, "causal_s3_switch360": 720},
                                          4: {"dense_s4": 720, "causal_s4_switch360": 720}}
    argv = shlex.split(train_command(study, next(r for r in runs if r.name == "dense_s3_steps400")))
    option = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert (option["--training.steps"], option["--lr_scheduler.total_steps"], option["--lr_scheduler.warmup_steps"],
            option["--validation.freq"], option["--checkpoint.interval"]) == ("400", "400", "40", "400", "400")
    stage2 = shlex.split(train_command(study, next(r for r in runs if r.name == "causal_s3_switch360")))
    assert stage2[stage2.index("--lr_scheduler.total_steps") + 1] == "720"
    assert "--validation.freq" not in stage2


@pytest.mark.parametrize("extra, message", [
    ("frontier = [400, 720]", r"frontier \[720\] must be below study.steps = 720"),
    ("frontier = [800]", r"frontier \[800\] must be below study.steps = 720"),
    ("frontier = [400, 400]", "repeats a value"),
    ("frontier = [1]", "integers >= 2"),
    ('corpus_sources = "lighthouse"', "must be a list of folder paths"),
], ids=["steps", "past-steps", "repeat", "too-short", "sources"])
def test_a_frontier_or_corpus_source_mistake_names_the_key_and_value(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        load_study(study_with(tmp_path, extra))


def test_the_checked_in_frontier_study_queues_the_anchor_then_each_seeds_frontier():
    runs = plan_runs(load_study(REPO / "configs" / "payoff" / "tiny_128k_frontier.toml"))
    assert [r.name for r in runs[:4]] == ["dense_s0", "dense_s0_steps600", "dense_s0_steps510", "dense_s0_steps400"]
    assert [r.kind for r in runs] == ["dense"] + ["frontier"] * 3 * 8


def test_an_extension_study_trains_stage_0_short_first_and_starts_every_fresh_run_from_its_weights(tmp_path):
    study = load_study(study_with(tmp_path, "frontier = [400]\nstage0_seq_len = 8192\nstage0_steps = 300"))
    runs = {r.name: r for r in plan_runs(study)}
    assert list(runs)[0] == "stage0_s3" and list(runs)[5] == "stage0_s4"
    argv = shlex.split(train_command(study, runs["stage0_s3"]))
    option = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert (option["--training.seq_len"], option["--training.steps"], option["--lr_scheduler.total_steps"],
            option["--lr_scheduler.warmup_steps"]) == ("8192", "300", "300", "30")
    for name in ("causal_s3", "dense_s3", "dense_s3_steps400"):
        assert runs[name].after == ("stage0_s3",)
        command = train_command(study, runs[name])
        assert "--checkpoint.initial_load_path out/stage0_s3/checkpoint/step-300" in command
        assert "--checkpoint.initial_load_model_only" in command and "--training.seq_len" not in command
    stage2 = train_command(study, runs["causal_s3_switch360"])
    assert runs["causal_s3_switch360"].after == ("causal_s3",) and "out/causal_s3/checkpoint/step-360" in stage2
    assert scored_models(study, list(runs.values()))[3] == {"dense_s3": 720, "dense_s3_steps400": 400,
                                                            "causal_s3_switch360": 720}


def test_an_extension_study_continued_elsewhere_trains_stage_0_again_only_for_the_seeds_with_runs_left(tmp_path):
    """Addendum 6: a seed whose arm and 720-step dense run are recorded trains its stage 0 again, then only its
    frontier; a seed whose every run is recorded trains nothing."""
    done = ["causal_s3_switch360", "dense_s3", "causal_s4_switch360", "dense_s4", "dense_s4_steps400"]
    study = load_study(study_with(tmp_path, f"frontier = [400]\nstage0_seq_len = 8192\nstage0_steps = 300\n"
                                            f"reported = {done!r}".replace("'", '"')))
    runs = plan_runs(study)
    assert [r.name for r in runs] == ["stage0_s3", "dense_s3_steps400"]
    assert runs[1].after == ("stage0_s3",)


def test_a_deterministic_stage_0_alone_trains_in_torchtitans_deterministic_mode(tmp_path):
    """Addendum 15: stage 0 trained again on another machine must reach the same weights, so only it runs in the
    deterministic mode (strict, no warn_only); the runs that start from it keep the study's kernels."""
    study = load_study(study_with(tmp_path, "frontier = [400]\nstage0_seq_len = 8192\nstage0_steps = 300\n"
                                            "stage0_deterministic = true"))
    commands = {r.name: shlex.split(train_command(study, r)) for r in plan_runs(study)}
    assert "--debug.deterministic" in commands["stage0_s3"]
    assert not any(a.startswith("--debug.deterministic_warn") for a in commands["stage0_s3"])
    assert [n for n, argv in commands.items() if "--debug.deterministic" in argv] == ["stage0_s3", "stage0_s4"]
    plain = load_study(study_with(tmp_path, "frontier = [400]\nstage0_seq_len = 8192\nstage0_steps = 300"))
    assert "--debug.deterministic" not in train_command(plain, plan_runs(plain)[0])


@pytest.mark.parametrize("extra, message", [
    ("stage0_seq_len = 8192", "needs study.stage0_steps"),
    ("stage0_deterministic = true", "stage0_deterministic = true needs study.stage0_seq_len"),
    ("stage0_seq_len = 8192\nstage0_steps = 300\nstage0_deterministic = 1", "must be true or false"),
    ('stage0_seq_len = 8192\nstage0_steps = 300\nreported = ["stage0_s3"]', r"names \['stage0_s3'\], which are not"),
    ("stage0_seq_len = 131072\nstage0_steps = 10", "below training.seq_len = 131072"),
    ("stage0_seq_len = 8192\nstage0_steps = 1", "stage0_steps = 1 must be an integer >= 2"),
], ids=["alone", "deterministic-alone", "deterministic-not-bool", "stage0-reported", "not-shorter", "steps"])
def test_a_stage_0_mistake_names_the_key_and_value(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        load_study(study_with(tmp_path, extra))
