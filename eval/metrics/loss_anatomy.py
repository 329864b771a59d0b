"""What a difference in held-out loss is made of: the loss of every token of the same held-out windows under
two models, split by the token's position and by whether the bytes before it occurred earlier in the window.

A token whose preceding n bytes occurred earlier in the window can be predicted by copying: look back to that
earlier occurrence and read the byte after it (an induction-like mechanism). Such a token is `copyable` when
that byte is the one to predict. The distance back to the latest earlier occurrence says how far the model must
reach. The share of a difference that a class carries is its tokens' summed difference over the windows'
summed difference, so the shares of a partition add up to 1.
"""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from eval.options import read_json

POSITION_EDGES = (0, 1024, 8192, 32768, 131072)
DISTANCE_BINS = (("local <1K", 1, 1024), ("1K-8K", 1024, 8192), ("8K-131K", 8192, None))
NGRAMS = (8, 16, 32)


def previous_occurrence(tokens: np.ndarray, n: int) -> np.ndarray:
    """For each position i of `tokens` [T], the latest j < i at which the n tokens ending at j equal the n tokens
    ending at i, else -1 (also for i < n - 1, which has fewer than n tokens before it): int64 [T]."""
    length = len(tokens)
    previous = np.full(length, -1, dtype=np.int64)
    if length < n:
        return previous
    grams = np.lib.stride_tricks.sliding_window_view(tokens, n)            # row r: tokens[r : r + n], ends at r+n-1
    _, group = np.unique(grams, axis=0, return_inverse=True)
    group = group.reshape(-1)
    order = np.lexsort((np.arange(len(group)), group))                     # by n-gram, then by position
    same = np.zeros(len(order), dtype=bool)
    same[1:] = group[order[1:]] == group[order[:-1]]
    ends = order + n - 1
    previous[ends[1:][same[1:]]] = ends[:-1][same[1:]]
    return previous


def token_classes(window: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Boolean masks [T] over the T labels of one window [T + 1] (label i is token i + 1, predicted from tokens
    0..i): `fresh` (the n tokens ending at i occur nowhere earlier), each distance bin of the latest earlier
    occurrence, and `copyable` (the token after that occurrence equals label i)."""
    inputs, labels = window[:-1], window[1:]
    previous = previous_occurrence(inputs, n)
    seen = previous >= 0
    distance = np.arange(len(inputs)) - previous
    classes = {"fresh": ~seen}
    for name, low, high in DISTANCE_BINS:
        classes[name] = seen & (distance >= low) & (distance < (high if high is not None else len(inputs) + 1))
    copy = np.zeros(len(inputs), dtype=bool)
    copy[seen] = window[previous[seen] + 1] == labels[seen]
    classes["copyable"] = copy
    return classes


def position_edges(*extra: int) -> tuple[int, ...]:
    """POSITION_EDGES with the positions `extra` as edges too (a context-extension study's stage-0 length, so that
    the positions past it form classes of their own); 0 adds nothing, being the first edge."""
    return tuple(sorted(set(POSITION_EDGES).union(extra)))


def position_classes(length: int, edges: tuple[int, ...] = POSITION_EDGES) -> dict[str, np.ndarray]:
    """Masks [length] of the positions in [edges[i], edges[i + 1]), named by their bounds."""
    index = np.arange(length)
    bounds = [e for e in edges if e < length] + [length]
    return {f"{_k(a)}-{_k(b)}": (index >= a) & (index < b) for a, b in zip(bounds, bounds[1:])}


def _k(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens >= 1024 else str(tokens)


def class_masks(windows: np.ndarray, edges: tuple[int, ...] = POSITION_EDGES) -> dict[str, dict[str, np.ndarray]]:
    """For windows [W, T + 1]: {partition: {class: mask [W, T]}} for `position` (between `edges`) and `ngram<n>`
    (fresh and the distance bins, a partition) with `ngram<n> copyable` (copyable or not, among the repeated
    tokens)."""
    length = windows.shape[1] - 1
    partitions = {"position": {name: np.broadcast_to(mask, (len(windows), length))
                               for name, mask in position_classes(length, edges).items()}}
    for n in NGRAMS:
        per_window = [token_classes(w, n) for w in windows]
        stacked = {name: np.stack([c[name] for c in per_window]) for name in per_window[0]}
        repeated = ~stacked["fresh"]
        partitions[f"ngram{n}"] = {name: mask for name, mask in stacked.items() if name != "copyable"}
        partitions[f"ngram{n} copyable"] = {"fresh": stacked["fresh"],
                                            "repeated, copyable": repeated & stacked["copyable"],
                                            "repeated, not copyable": repeated & ~stacked["copyable"]}
    return partitions


def describe(losses: dict[str, np.ndarray], windows: np.ndarray, edges: tuple[int, ...] = POSITION_EDGES) -> dict:
    """Each model's mean loss per class of every partition (positions between `edges`), with each class's share of
    the tokens: {"tokens": W*T, "models": {name: mean}, partition: {class: {"share": ..., name: mean}}}."""
    masks = class_masks(windows, edges)
    report: dict = {"tokens": int(windows.shape[0] * (windows.shape[1] - 1)),
                    "models": {name: float(loss.mean(dtype=np.float64)) for name, loss in losses.items()}}
    for partition, classes in masks.items():
        report[partition] = {}
        for cls, mask in classes.items():
            count = int(mask.sum())
            row = {"share": count / mask.size}
            for name, loss in losses.items():
                row[name] = float(loss[mask].mean(dtype=np.float64)) if count else None
            report[partition][cls] = row
    return report


def difference(losses: dict[str, np.ndarray], windows: np.ndarray, higher: str, lower: str,
               edges: tuple[int, ...] = POSITION_EDGES) -> dict:
    """Where `higher`'s loss exceeds `lower`'s: per class of every partition (positions between `edges`), the mean
    difference and the share of the total difference it carries: {"total": mean difference, partition: {class:
    {"mean", "carried"}}}."""
    delta = losses[higher].astype(np.float64) - losses[lower].astype(np.float64)
    total = delta.sum()
    report: dict = {"higher": higher, "lower": lower, "total": float(delta.mean())}
    for partition, classes in class_masks(windows, edges).items():
        report[partition] = {
            cls: {"tokens": float(mask.mean()), "mean": float(delta[mask].mean()) if mask.any() else None,
                  "carried": float(delta[mask].sum() / total) if total else None}
            for cls, mask in classes.items()}
    return report


def markdown(differences: list[dict], partitions: tuple[str, ...] = ("position", "ngram16", "ngram16 copyable")
             ) -> str:
    """One table per partition: a row per class (its token share), per comparison the mean difference and the
    share of the difference it carries."""
    lines = []
    for partition in partitions:
        heads = " | ".join(f"{d['higher']} - {d['lower']}: mean / carried" for d in differences)
        lines += [f"**{partition}**", "", f"| class | tokens | {heads} |", "|---|---|" + "---|" * len(differences)]
        for cls in differences[0][partition]:
            row = differences[0][partition][cls]
            cells = " | ".join(_cell(d[partition][cls]) for d in differences)
            lines.append(f"| {cls} | {row['tokens']:.1%} | {cells} |")
        lines.append("")
    return "\n".join(lines)


def _cell(entry: dict) -> str:
    if entry["mean"] is None:
        return "-"
    carried = "-" if entry["carried"] is None else f"{entry['carried']:.0%}"
    return f"{entry['mean']:+.4f} / {carried}"


def plot(differences: list[dict], path: str, title: str,
         partitions: tuple[str, ...] = ("position", "ngram16", "ngram16 copyable")) -> None:
    """Bars of the share of each difference that each class carries, one panel per partition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(partitions), figsize=(5 * len(partitions), 4), squeeze=False)
    width = 0.8 / len(differences)
    for ax, partition in zip(axes[0], partitions):
        classes = list(differences[0][partition])
        for i, d in enumerate(differences):
            carried = [d[partition][c]["carried"] or 0.0 for c in classes]
            ax.bar(np.arange(len(classes)) + i * width, carried, width,
                   label=f"{d['higher']} - {d['lower']} ({d['total']:+.3f})")
        tokens = [differences[0][partition][c]["tokens"] for c in classes]
        ax.plot(np.arange(len(classes)) + 0.4 - width / 2, tokens, "k_", ms=18, mew=2, label="share of tokens")
        ax.set_xticks(np.arange(len(classes)) + 0.4 - width / 2, classes, rotation=20, fontsize=7)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_title(partition, fontsize=9)
        ax.set_ylabel("share of the loss difference carried")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# What a dump's two files must hold, as the messages about one that does not say.
DUMP = "the dump command's .npz (its windows and a loss/<model> array per model)"
DUMP_RECORD = "the dump command's record (an object, its niah an object)"


def _dump_record(value: object) -> bool:
    """Whether the JSON `value` is a dump's record: an object whose niah, if any, is an object."""
    return isinstance(value, dict) and isinstance(value.get("niah", {}), dict)


def read_dump(path: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The windows and each model's losses of the dump at path prefix `path`; an .npz that cannot be read or that
    holds other arrays is a ValueError naming --dump and the file (it ended in a traceback, or a message that
    named neither)."""
    npz = path.with_suffix(".npz")
    where = f"--dump {str(path)!r}: {npz}"
    if not npz.is_file():
        raise ValueError(f"--dump {str(path)!r}: no {npz.name} (write it with the dump command)")
    if not zipfile.is_zipfile(npz):  # np.load would read it as a pickle and talk of allow_pickle
        raise ValueError(f"{where} is not an .npz (a zip archive); expected {DUMP}")
    try:
        with np.load(npz) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:  # a damaged member
        raise ValueError(f"{where} cannot be read ({err}); expected {DUMP}") from None
    windows = arrays.get("windows")
    if windows is None or windows.ndim != 2 or windows.shape[1] < 2 or windows.dtype.kind not in "iu":
        raise ValueError(f"{where} holds no windows array of token ids; expected {DUMP}")
    losses = {key.split("/", 1)[1]: value for key, value in arrays.items() if key.startswith("loss/")}
    if not losses:
        raise ValueError(f"{where} holds no loss/<model> array; expected {DUMP}")
    shape = (windows.shape[0], windows.shape[1] - 1)
    for name, loss in losses.items():
        if loss.shape != shape or loss.dtype.kind != "f":
            raise ValueError(f"{where}: loss/{name} is {loss.dtype} of shape {list(loss.shape)}, but its windows "
                             f"{list(windows.shape)} need floats of shape {list(shape)}")
    return windows, losses


def read_dumps(paths: list[Path]) -> tuple[np.ndarray, dict[str, np.ndarray], dict]:
    """The windows and every model's losses of the dumps (which must hold the same windows), and their NIAH."""
    windows, losses, niah = None, {}, {}
    for path in paths:
        dumped, dumped_losses = read_dump(path)
        if windows is None:
            windows = dumped
        elif not np.array_equal(windows, dumped):
            raise ValueError(f"--dump {str(path)!r} holds other windows than {str(paths[0])!r}")
        losses.update(dumped_losses)
        record = path.with_suffix(".json")
        if record.is_file():
            niah.update(read_json(record, f"--dump {str(path)!r}:", DUMP_RECORD, _dump_record).get("niah", {}))
    return windows, losses, niah
