"""Do two trainings of one command agree? Per logged tag, the steps where both runs logged it, the first step where
they differ, the largest difference and the final values: what decides whether a run trained again (on another
machine, or after its weights were lost) can stand in for the first (docs/studies/time_to_quality_long.md,
addenda 6 and 8)."""
from __future__ import annotations

from pathlib import Path

from eval.studies.time_to_quality import DENSE_LOSS, validation_losses
from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.logs.run_logs import LOSS_TAG

TAGS = (LOSS_TAG, "grad_norm", DENSE_LOSS)  # the training loss, the gradient norm, the held-out loss


def logged(folder: Path, tag: str) -> dict[int, float]:
    """step -> `tag` as the run in `folder` logged it; a step logged again after a resume keeps its last value."""
    return validation_losses(read_metrics(str(folder / METRICS_FILE)), tag)


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
    """tag -> `agreement` of the runs in the two folders, for each of `tags` that both logged."""
    found = {tag: (logged(first, tag), logged(second, tag)) for tag in tags}
    return {tag: agreement(a, b) for tag, (a, b) in found.items() if a and b}
