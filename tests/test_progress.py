"""Progress bars of the evaluations (eval.progress): on stderr when asked or on a terminal, silent otherwise, and
the results the same either way."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from eval.causality import causality_audit
from eval.heldout import setting_losses
from eval.niah import run_niah
from recipe.tokenizer import ByteTokenizer

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
    for progress in (True, None, False):  # capsys's stderr is no terminal: None draws nothing
        results.append(EVALUATIONS[name](seed, progress))
        out, err = capsys.readouterr()
        assert out == "" and ((f"{name}: 100%" in err) if progress else err == ""), err
    assert results[0] == results[1] == results[2]
