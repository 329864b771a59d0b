"""Do two trainings of one command agree? Per logged tag, the steps where both runs logged it, the first step where
they differ, the largest difference and the final values: what decides whether a run trained again (on another
machine, or after its weights were lost) can stand in for the first (docs/studies/time_to_quality_long.md,
addenda 6 and 8)."""
from __future__ import annotations

from pathlib import Path

from eval.studies.time_to_quality import DENSE_LOSS
from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.logs.run_logs import LOSS_TAG

TAGS = (LOSS_TAG, "grad_norm", DENSE_LOSS)  # the training loss, the gradient norm, the held-out loss


def logged(folder: Path, tags: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """tag -> (step -> value) for each of `tags` as the run in `folder` logged it in its metrics.jsonl (event
    records left out); a step logged again after a resume keeps its last value. A malformed line (read_metrics),
    or a value of `tags` that is not a number, is a ValueError naming the file (it ended in a traceback, or in a
    message that named neither)."""
    path = folder / METRICS_FILE
    values: dict[str, dict[int, float]] = {tag: {} for tag in tags}
    for record in read_metrics(str(path)):
        for tag in [tag for tag in tags if tag in record]:
            if not isinstance(value := record[tag], (int, float)) or isinstance(value, bool):
                raise ValueError(f"{path}: {tag}={value!r} at step {record['step']} is not a number")
            values[tag][record["step"]] = value
    return values


def agreement(first: dict[int, float], second: dict[int, float]) -> dict:
    """How `second` (step -> value) departs from `first`: over the steps both logged, whether every value is
    bitwise equal, the first step that differs, the largest |difference|, the final values and their difference
    (second minus first), and the steps only one of them logged."""
    steps = sorted(first.keys() & second.keys())
    if not steps:
        raise ValueError("the two runs logged this tag at no common step")
    differing = [s for s in steps if first[s] != second[s]]
    last = steps[-1]
    return {"steps": len(steps), "bitwise": not differing, "first_difference": differing[0] if differing else None,
            "max_abs_difference": max(abs(second[s] - first[s]) for s in steps),
            "final_step": last, "final": [first[last], second[last]], "final_difference": second[last] - first[last],
            "only_in_one": len(first.keys() ^ second.keys())}


def compare_runs(first: Path, second: Path, tags: tuple[str, ...] = TAGS) -> dict[str, dict]:
    """tag -> `agreement` of the runs in the two folders, for each of `tags` that both logged. A ValueError names
    the one metrics.jsonl at fault (`logged`), or both folders and the tag they logged at no common step."""
    a, b = logged(first, tags), logged(second, tags)
    compared = {}
    for tag in [tag for tag in tags if a[tag] and b[tag]]:
        try:
            compared[tag] = agreement(a[tag], b[tag])
        except ValueError:  # agreement's one refusal: no step logged by both
            raise ValueError(f"{first} and {second} logged {tag} at no common step") from None
    return compared
