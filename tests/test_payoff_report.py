"""The pay-off map's report over joined records: censored time to quality and the separation step."""
import random

from eval.studies import payoff


def run(name: str, seed: int, final: float, seconds: float, reached: float | None = None) -> dict:
    r = {"name": name, "seed": seed, "selection": "dense" if name.startswith("dense") else "causal",
         "final_heldout_loss": final, "train_seconds": seconds, "commit": "abc"}
    if not name.startswith("dense"):
        r["dense_seconds_to_this_loss"] = reached
        if reached is not None:
            r["time_to_quality_speedup"] = round(reached / seconds, 4)
    return r


def test_a_run_dense_never_matches_counts_as_a_lower_bound_in_the_median_not_as_missing():
    records = [run("dense_s0", 0, 2.33, 490.0), run("dense_s1", 1, 2.24, 480.0), run("dense_s2", 2, 2.25, 500.0),
               run("causal_s0_switch360", 0, 2.30, 350.0), run("causal_s1_switch360", 1, 2.31, 400.0, reached=320.0),
               run("causal_s2_switch360", 2, 2.32, 250.0, reached=200.0)]
    arm = payoff.distributions(records, threshold=2.2877)["arms"]["causal_switch360"]
    assert arm["seeds"][0]["time_to_quality_at_least"] == 1.4  # 490 s of dense over 350 s
    assert "time_to_quality" not in arm["seeds"][0] and arm["seeds"][1]["time_to_quality"] == 0.8
    assert arm["time_to_quality_median"] == 0.8  # of 0.8, 0.8 and >= 1.4: exact, the bound lies above it
    assert "time_to_quality_median_at_least" not in arm
    table = payoff.markdown(payoff.distributions(records, threshold=2.2877))
    assert "2.3000, >= 1.40x" in table


def test_a_median_resting_on_a_bound_is_reported_as_at_least():
    records = [run("dense_s0", 0, 2.33, 300.0), run("dense_s1", 1, 2.24, 300.0),
               run("causal_s0_switch360", 0, 2.30, 300.0), run("causal_s1_switch360", 1, 2.31, 150.0, reached=300.0)]
    arm = payoff.distributions(records, threshold=None)["arms"]["causal_switch360"]
    assert arm["time_to_quality_median"] == 1.5 and arm["time_to_quality_median_at_least"] is True
    assert "| >= 1.5 |" in payoff.markdown(payoff.distributions(records, threshold=None))


def test_the_separation_step_reads_earlier_records_without_step_curves_on_the_validated_steps():
    rng = random.Random()
    steps = [1, 60, 120, 180, 240]
    lower = {seed: [6.0, 2.7, 2.6, 2.45 - rng.random() / 100, 2.40] for seed in (1, 3)}
    upper = {seed: [6.0, 2.7, 2.6, 2.52 + rng.random() / 100, 2.47] for seed in (0, 2)}
    records = []
    for seed, losses in {**lower, **upper}.items():
        r = run(f"dense_s{seed}", seed, losses[-1], 100.0)
        r["total_steps"] = 240
        if seed < 2:  # written before step curves were recorded: seconds only
            r["curve"] = [[10.0 * i, v] for i, v in enumerate(losses)]
        else:
            r["step_curve"] = [[s, v] for s, v in zip(steps, losses)]
        records.append(r)
    curves = payoff.dense_step_curves(records, validation_freq=60)
    assert sorted(curves) == [0, 1, 2, 3] and [s for s, _ in curves[0]] == steps
    assert payoff.separation_step(curves, lower=set(lower)) == 180
    short = {**records[0], "curve": records[0]["curve"][:-1]}  # not one point per validated step: left out
    assert 0 not in payoff.dense_step_curves([short], validation_freq=60)


def test_joining_an_earlier_report_again_keeps_one_record_per_run_and_the_run_folder_wins():
    earlier = [run("dense", 0, 2.33, 490.0), run("dense_s1", 1, 2.24, 480.0),
               run("causal_s1_switch360", 1, 2.31, 400.0)]
    here = [run("dense_s0", 0, 2.3317, 491.0), run("causal_s2_switch360", 2, 2.35, 342.0)]
    joined = payoff.join(here, earlier)
    assert [(r["name"], r["final_heldout_loss"]) for r in joined] == [
        ("dense_s1", 2.24), ("causal_s1_switch360", 2.31), ("dense_s0", 2.3317), ("causal_s2_switch360", 2.35)]


def test_a_run_folder_that_wins_keeps_the_note_and_the_loss_by_position_of_its_earlier_copy():
    """The note is written into the committed record by hand, and the per-token dump of a run may be gone from its
    folder: neither may be lost when the folder's own record wins."""
    rng = random.Random(5)
    losses = {cls: rng.uniform(1.4, 1.8) for cls in ("0-1K", "1K-8K", "past stage 0")}
    earlier = [{**run("causal_s1_switch360", 1, 2.31, 400.0), "note": "tree abc1234", "position_losses": losses},
               {**run("dense_s1", 1, 2.24, 480.0), "note": "tree abc1234"}]
    here = [run("causal_s1_switch360", 1, 2.3117, 401.0),
            {**run("dense_s1", 1, 2.2411, 481.0), "note": "tree def5678", "position_losses": {"0-1K": 1.5}}]
    joined = {r["name"]: r for r in payoff.join(here, earlier)}
    assert joined["causal_s1_switch360"]["final_heldout_loss"] == 2.3117, "the folder's measurement wins"
    assert joined["causal_s1_switch360"]["note"] == "tree abc1234"
    assert joined["causal_s1_switch360"]["position_losses"] == losses
    assert joined["dense_s1"]["note"] == "tree def5678" and joined["dense_s1"]["position_losses"] == {"0-1K": 1.5}


def test_bits_per_byte_are_tabled_beside_the_per_token_finals_when_the_runs_logged_them():
    rng = random.Random(3)
    records = [run("dense_s0", 0, 2.33, 490.0), run("causal_s0_switch360", 0, 2.30, 350.0, reached=400.0),
               run("dense_s1", 1, 2.24, 480.0)]
    assert "bits per byte" not in payoff.markdown(payoff.distributions(records, threshold=None))
    for r in records[:2]:
        r["final_bits_per_byte"] = rng.uniform(0.5, 1.5)
    summary = payoff.distributions(records, threshold=None)
    assert (summary["arms"]["causal_switch360"]["seeds"][0]["bits_per_byte"]
            == round(records[1]["final_bits_per_byte"], 4))
    table = payoff.markdown(summary)
    assert "bits per byte" in table
    assert f"| dense | {records[0]['final_bits_per_byte']:.4f} | - |" in table  # seed 1 logged none


def test_an_extension_run_joins_its_seeds_earlier_records_only_from_the_same_stage_0():
    """Addendum 15: a seed continued in a later allocation trains its stage 0 again (deterministic mode); its new
    runs join the seed's earlier ones only where that stage 0 ended at exactly the same held-out loss."""
    stage0 = random.uniform(1.9, 2.1)
    earlier = [{**run("dense_s0", 0, 2.3, 480.0), "stage0_final_heldout_loss": stage0},
               {**run("dense_s1", 1, 2.3, 480.0), "stage0_final_heldout_loss": stage0 + 0.01}]
    same = {**run("dense_s0_steps400", 0, 2.4, 260.0), "stage0_final_heldout_loss": stage0}
    drifted = {**run("dense_s1_steps400", 1, 2.4, 260.0), "stage0_final_heldout_loss": stage0 + 0.01 + 1e-7}
    new_seed = {**run("dense_s2_steps400", 2, 2.4, 260.0), "stage0_final_heldout_loss": stage0}
    assert payoff.stage0_confounded([same, drifted, new_seed], earlier) == [drifted]


def test_a_seed_whose_records_name_two_cards_is_set_aside_whole_and_records_without_cards_are_not_checked():
    """Addendum 28: each seed is placed against its own dense runs, so all of it must be timed on one card model;
    another seed may run on another card."""
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    earlier = [{**run("dense_s2", 2, 2.3, 480.0), "cards": [h200]}, run("dense_s1", 1, 2.3, 480.0)]
    moved = {**run("dense_s2_steps600", 2, 2.35, 400.0), "cards": [h100]}  # seed 2 went on on another card
    switched = {**run("dense_s4", 4, 2.3, 480.0), "cards": [h200, h100]}  # one run resumed on another card
    beside = {**run("causal_s4_switch360", 4, 2.3, 300.0), "cards": [h200]}
    own_card = [{**run("dense_s3", 3, 2.3, 600.0), "cards": [h100]},
                {**run("causal_s3_switch360", 3, 2.3, 390.0), "cards": [h100]}]
    unrecorded = run("dense_s1_steps400", 1, 2.4, 260.0)
    assert payoff.card_mixed([moved, switched, beside, *own_card, unrecorded], earlier) == [moved, switched, beside]
