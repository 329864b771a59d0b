"""Two trainings of one command compared step by step (`scripts/run_agreement.py`): bit for bit or not, the first
step that differs, the largest difference and where each run ends; a folder without a run is refused by name."""
import json
import random
from pathlib import Path

import pytest

from eval.studies.run_agreement import agreement, compare_runs
from tests.helpers import child_env, script_exit_code
from tests.warm_python import run_python

LOSS, VALIDATION = "loss_metrics/global_avg_loss", "validation/dense_loss"


def write_run(folder: Path, losses: dict[int, float], validated: dict[int, float]) -> Path:
    """A dump folder whose metrics.jsonl logs `losses` (training) and `validated` (held-out), as the trainer does."""
    folder.mkdir(parents=True)
    rows = [{"event": "run_start", "step": 1}]
    rows += [{"step": s, LOSS: v, "grad_norm": 1.0 + v} for s, v in losses.items()]
    rows += [{"step": s, VALIDATION: v} for s, v in validated.items()]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def curve(steps: int) -> dict[int, float]:
    return {s: random.uniform(1.0, 6.0) for s in range(1, steps + 1)}


def test_identical_runs_agree_bit_for_bit(tmp_path):
    losses, validated = curve(random.randint(5, 40)), curve(3)
    result = compare_runs(write_run(tmp_path / "a", losses, validated), write_run(tmp_path / "b", losses, validated))
    assert set(result) == {LOSS, "grad_norm", VALIDATION}
    for tag in result.values():
        assert tag["bitwise"] and tag["first_difference"] is None
        assert tag["max_abs_difference"] == 0 and tag["final_difference"] == 0 and tag["only_in_one"] == 0


def test_a_difference_is_found_at_its_step_with_its_size():
    first = curve(random.randint(10, 50))
    step, size = random.randint(2, len(first) - 1), random.uniform(1e-7, 1e-2)
    second = dict(first)
    for s in range(step, len(first) + 1):  # from there on the runs part, as a small difference grows
        second[s] = first[s] + size * (s - step + 1)
    result = agreement(first, second)
    assert not result["bitwise"] and result["first_difference"] == step
    assert result["max_abs_difference"] == pytest.approx(size * (len(first) - step + 1))
    assert result["final"] == [first[len(first)], second[len(first)]]
    assert result["final_difference"] == pytest.approx(second[len(first)] - first[len(first)])


def test_steps_only_one_run_logged_are_counted_not_compared():
    first = curve(20)
    second = {s: v for s, v in first.items() if s <= 15}
    result = agreement(first, second)
    assert result["bitwise"] and result["steps"] == 15 and result["final_step"] == 15 and result["only_in_one"] == 5
    with pytest.raises(ValueError, match="no common step"):
        agreement({1: 1.0}, {2: 1.0})


def test_a_resumed_run_is_read_at_the_value_logged_last(tmp_path):
    losses = curve(12)
    folder = write_run(tmp_path / "a", losses, {12: 2.0})
    again = {s: losses[s] + 1.0 for s in range(9, 13)}  # steps 9-12 logged again after a resume from step 8
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"event": "run_start", "step": 9}) + "\n")
        f.writelines(json.dumps({"step": s, LOSS: v}) + "\n" for s, v in again.items())
    result = compare_runs(folder, write_run(tmp_path / "b", {**losses, **again}, {12: 2.0}))
    assert result[LOSS]["bitwise"]


def test_the_script_writes_a_record_and_refuses_a_folder_without_a_run(tmp_path, monkeypatch, capsys):
    losses = curve(8)
    a, b = write_run(tmp_path / "a", losses, {8: 2.5}), write_run(tmp_path / "b", {**losses, 8: 9.0}, {8: 2.5})
    out = tmp_path / "cmp.json"
    run = run_python(["scripts/run_agreement.py", str(a), str(b), "--device", "NVIDIA H200", "--commit", "abc1234",
                      "--json", str(out)], env=child_env(), timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"{LOSS}: 8 steps, differ from step 8" in run.stdout
    record = json.loads(out.read_text())
    assert record["device"] == "NVIDIA H200" and record["commit"] == "abc1234"
    assert record["tags"][VALIDATION]["bitwise"] and record["tags"][LOSS]["final"] == [losses[8], 9.0]
    assert script_exit_code("run_agreement.py", [str(a), str(tmp_path / "none")], monkeypatch) == 2
    assert f"{tmp_path / 'none'} has no metrics.jsonl" in capsys.readouterr().err
