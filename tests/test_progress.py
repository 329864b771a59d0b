"""Progress of the evaluations (recipe.progress): a bar on stderr when asked or on a terminal, lines every few
seconds off a terminal, nothing with --no-progress, and the results the same either way."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from eval.metrics.causality import causality_audit
from eval.metrics.heldout import setting_losses
from eval.metrics.niah import run_niah
from recipe import progress
from recipe.data.tokenizer import ByteTokenizer

VOCAB = 258


def random_logits(ids: torch.Tensor) -> torch.Tensor:
    """Logits of a model that knows nothing, the same for the same ids (so every run of a test agrees)."""
    generator = torch.Generator().manual_seed(int(ids.sum()))
    return torch.randn(*ids.shape, VOCAB, generator=generator)


class DenseSwitch(torch.nn.Module):
    """The one method of the recipe's model that setting_losses calls."""

    def set_lighthouse_enabled(self, enabled: bool) -> None:
        self.enabled = enabled


def niah(seed: int, progress: bool | None) -> Any:
    tokenizer = ByteTokenizer()
    return run_niah(random_logits, lambda text: tokenizer.encode(text, add_bos=False, add_eos=False),
                    [96 + 32 * (seed % 2)], [25, 75], seed=seed, progress=progress).accuracy


def audit(seed: int, progress: bool | None) -> Any:
    windows = torch.randint(0, VOCAB, (3, 33), generator=torch.Generator().manual_seed(seed))
    return [r.as_dict() for r in causality_audit(random_logits, windows, [1, 4], samples=5, seed=seed, batch_size=2,
                                                 progress=progress)]


def heldout(seed: int, progress: bool | None) -> Any:
    windows = torch.randint(0, VOCAB, (5, 33), generator=torch.Generator().manual_seed(seed))
    return setting_losses(DenseSwitch(), random_logits, windows, lighthouse=True, batch_size=2, progress=progress)[0]


EVALUATIONS: dict[str, Callable[[int, bool | None], Any]] = {
    "NIAH": niah, "causality audit": audit, "held-out loss (dense)": heldout}


@pytest.mark.parametrize("name", EVALUATIONS)
def test_a_bar_is_drawn_on_stderr_when_asked_and_never_off_a_terminal_unless_asked(name, capsys):
    seed = torch.randint(0, 2**31, ()).item()
    results = []
    for progress in (True, None, False):  # capsys's stderr is no terminal: None prints lines, none for short work
        results.append(EVALUATIONS[name](seed, progress))
        out, err = capsys.readouterr()
        assert out == "" and ((f"{name}: 100%" in err) if progress else err == ""), err
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("name", EVALUATIONS)
def test_off_a_terminal_long_work_prints_a_line_every_few_seconds(name, capsys, monkeypatch):
    ticks = iter(range(0, 10**6, 2))  # every clock reading 2 s later than the one before

    class SlowLines(progress.ProgressLines):
        def __init__(self, total: int, desc: str) -> None:
            super().__init__(total, desc, every=5.0, clock=lambda: float(next(ticks)))

    monkeypatch.setattr(progress, "ProgressLines", SlowLines)
    EVALUATIONS[name](torch.randint(0, 2**31, ()).item(), None)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) >= 2 and "\r" not in err
    assert all(line.startswith(name.split(" (")[0]) and line.endswith(" s") for line in lines)
    total = lines[-1].split(": ")[1].split("/")[1].split(" ")[0]
    assert lines[-1].startswith(f"{name}: {total}/{total} (100%), ")


def test_progress_lines_wait_for_the_interval_and_say_the_end_only_after_a_line():
    now = [0.0]
    lines = progress.ProgressLines(10, "work", every=5.0, clock=lambda: now[0])
    printed = []
    lines.line = lambda at: printed.append((lines.n, at)) or setattr(lines, "shown", lines.n) or \
        setattr(lines, "last", at)
    for step in range(10):
        now[0] = 2.0 * (step + 1)
        lines.update()
    lines.close()
    assert printed == [(3, 6.0), (6, 12.0), (9, 18.0), (10, 20.0)]
    quiet = progress.ProgressLines(3, "short", every=5.0, clock=lambda: 1.0)
    quiet.line = lambda at: pytest.fail("short work printed a line")
    for _ in range(3):
        quiet.update()
    quiet.close()


def test_training_says_when_its_first_step_starts_and_names_a_slow_step_between_metrics_lines():
    assert progress.first_step_line(1, 65_536, "cpu").startswith("step 1 started: 65,536 tokens a microbatch on cpu")
    assert progress.slow_step_line(7, progress.SLOW_STEP_S + 1, logged=False) == (
        f"step 7 done in {progress.SLOW_STEP_S + 1:.0f} s (metrics every metrics.log_freq steps)")
    assert progress.slow_step_line(7, progress.SLOW_STEP_S + 1, logged=True) is None  # torchtitan's line says it
    assert progress.slow_step_line(7, progress.SLOW_STEP_S, logged=False) is None  # a quick step says nothing
