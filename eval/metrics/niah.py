"""Needle in a haystack, the paper's protocol: one passkey digit hidden in random alphanumeric filler.

For every (context length, depth) cell and every digit 0-9, one prompt is built: filler of the given
length with the passkey sentence inserted at `depth` percent of it, ending in a question whose answer is
the digit. Lengths are in the model's tokens (bytes, or a Hugging Face tokenizer's: `text_encoder`). One forward pass;
the prediction is the argmax over the 10 digit tokens at the last position.
A cell's score is the mean accuracy over the 10 digits.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from recipe.progress import progress_bar
from torchtitan.components.tokenizer import BaseTokenizer

from recipe.data.tokenizer import ByteTokenizer

DEPTHS = (0, 15, 30, 50, 70, 85, 100)
NEEDLE = "The passkey is {digit}. Remember it. "
QUESTION = " What is the passkey? The passkey is "
_ALPHABET = string.ascii_letters + string.digits


@dataclass
class NiahResult:
    """Accuracy per cell: `accuracy[i][j]` for `lengths[i]` tokens and `depths[j]` percent."""

    lengths: list[int]
    depths: list[int]
    accuracy: list[list[float]]

    @property
    def mean(self) -> float:
        cells = [a for row in self.accuracy for a in row]
        return sum(cells) / len(cells)

    def to_dict(self) -> dict:
        return {"lengths": self.lengths, "depths": self.depths, "accuracy": self.accuracy, "mean": self.mean}


def text_encoder(tokenizer: BaseTokenizer) -> Callable[[str], list[int]]:
    """How prompts are encoded for a model of `tokenizer`: its ids without BOS or EOS."""
    return lambda text: tokenizer.encode(text, add_bos=False, add_eos=False)


byte_encode = text_encoder(ByteTokenizer())  # the recipe's byte tokenizer


def check_prompt_lengths(encode: Callable[[str], list[int]], lengths: Sequence[int]) -> None:
    """Raise ValueError naming the lengths too short for the needle and question."""
    shortest = max(len(encode(NEEDLE.format(digit=d))) for d in range(10)) + len(encode(QUESTION))
    if short := [n for n in lengths if n < shortest]:
        raise ValueError(f"NIAH lengths {short} are shorter than the needle and question ({shortest} tokens)")


def check_depths(depths: Sequence[int]) -> None:
    """Raise ValueError for no depth at all (a grid of no cell has no mean) or naming the depths that are no
    percentage."""
    if not depths:
        raise ValueError("no NIAH depth: give comma-separated percentages in [0, 100], e.g. 0,50,100")
    if off := [d for d in depths if not 0 <= d <= 100]:
        raise ValueError(f"NIAH depths {off} must be percentages in [0, 100]")


def check_grid(encode: Callable[[str], list[int]], lengths: Sequence[int], depths: Sequence[int] = DEPTHS) -> None:
    """Both checks, so that a bad grid is refused before a model is loaded (a script checks each on its own, to
    name the option that gave it)."""
    check_prompt_lengths(encode, lengths)
    check_depths(depths)


def build_prompt(
    encode: Callable[[str], list[int]], length: int, depth: int, digit: int, rng: random.Random
) -> list[int]:
    """Token ids of exactly `length` tokens: filler with the needle at `depth`% and the question at the end."""
    if not 0 <= depth <= 100:
        raise ValueError(f"depth={depth} must be a percentage in [0, 100]")
    needle, question = encode(NEEDLE.format(digit=digit)), encode(QUESTION)
    filler_len = length - len(needle) - len(question)
    if filler_len < 0:
        raise ValueError(f"length={length} is shorter than the needle and question "
                         f"({len(needle) + len(question)} tokens)")
    text, filler = "", []
    while len(filler) < filler_len:  # one character a token with bytes; a subword tokenizer needs more characters
        text += "".join(rng.choice(_ALPHABET) for _ in range(filler_len - len(filler)))
        filler = encode(text)
    filler = filler[:filler_len]
    at = filler_len * depth // 100
    return filler[:at] + needle + filler[at:] + question


@torch.no_grad()
def run_niah(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    encode: Callable[[str], list[int]],
    lengths: Sequence[int],
    depths: Sequence[int] = DEPTHS,
    seed: int = 0,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
) -> NiahResult:
    """Score `logits_fn` (token ids [1, T] -> logits [1, T, V]) on every (length, depth) cell; a progress bar
    over the forward passes when `progress` says so (recipe.progress)."""
    digit_ids = torch.tensor([encode(str(d))[0] for d in range(10)], device=device)
    rng = random.Random(seed)
    accuracy = []
    bar = progress_bar(len(lengths) * len(depths) * 10, "NIAH", progress)
    for length in lengths:
        row = []
        for depth in depths:
            hits = 0
            for digit in range(10):
                ids = torch.tensor([build_prompt(encode, length, depth, digit, rng)], device=device)
                last = logits_fn.last_logits(ids)[0] if hasattr(logits_fn, "last_logits") else logits_fn(ids)[0, -1]
                hits += int(last[digit_ids].argmax().item() == digit)
                bar.update()
            row.append(hits / 10)
        accuracy.append(row)
    bar.close()
    return NiahResult(list(lengths), list(depths), accuracy)


def markdown(results: dict[str, dict]) -> str:
    """A table of `NiahResult.to_dict()` records by model name: the mean, then every (length, depth) cell, "-"
    where a model's grid lacks it. Guessing one of the ten digits scores 0.1."""
    grids = {name: {(n, d): r["accuracy"][i][j] for i, n in enumerate(r["lengths"]) for j, d in enumerate(r["depths"])}
             for name, r in results.items()}
    cells = sorted({cell for grid in grids.values() for cell in grid})
    lines = ["**NIAH** (accuracy; guessing scores 0.1)", "",
             "| model | mean | " + " | ".join(f"{n:,} @ {d}%" for n, d in cells) + " |",
             "|---|---|" + "---|" * len(cells)]
    for name, grid in grids.items():
        lines.append(f"| {name} | {results[name]['mean']:.3f} | "
                     + " | ".join(f"{grid[c]:.1f}" if c in grid else "-" for c in cells) + " |")
    return "\n".join(lines)


def plot_heatmap(result: NiahResult, path: str, title: str) -> None:
    """Write the accuracy grid as a PNG heatmap (lengths down, depths across)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(result.depths), 1.0 + 0.5 * len(result.lengths)))
    im = ax.imshow(result.accuracy, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(result.depths)), [f"{d}%" for d in result.depths])
    ax.set_yticks(range(len(result.lengths)), [str(n) for n in result.lengths])
    ax.set_xlabel("needle depth")
    ax.set_ylabel("context length (tokens)")
    ax.set_title(f"{title} (mean {result.mean:.2f})")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
