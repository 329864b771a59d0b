"""Lighthouse statistics for the training log: gathered length S, and per level the share of entries
expanded and how evenly the expansions cover the sequence (a drop in evenness flags span collapse).

Evenness of level l: each of the T tiles is cut into up to 8 equal sub-spans (fewer when a tile has fewer
level-l entries); the histogram of expanded level-l entries over these T * 8 bins has normalised entropy
1.0 when spread evenly and 0.0 when every expansion falls in one bin. Tiles already force an even split
at tile granularity, so the sub-spans measure collapse inside tiles.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from lighthouse import LighthouseConfig, Selection, select
from lighthouse.context_parallel import all_gather_stacked, chunk_config, shard_selections

SUBSPANS_PER_TILE = 8


def evenness_bins(config: LighthouseConfig, seq_len: int, level: int) -> int:
    """Number of equal bins the level-`level` entries are histogrammed over."""
    entries_per_tile = seq_len // config.pool**level // config.num_tiles
    return config.num_tiles * min(SUBSPANS_PER_TILE, entries_per_tile)


def normalized_entropy(counts: torch.Tensor) -> torch.Tensor:
    """Entropy of the histograms in the last axis divided by log(#bins): 1 = uniform, 0 = one bin."""
    p = counts / counts.sum(-1, keepdim=True).clamp_min(1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    return entropy / math.log(counts.shape[-1]) if counts.shape[-1] > 1 else torch.ones_like(entropy)


def expansion_histogram(selection: Selection, config: LighthouseConfig, seq_len: int, level: int) -> torch.Tensor:
    """Expanded level-`level` entries of a Selection ([B, G, S] fields) per evenness bin: float64 [B, G, bins]."""
    entries = seq_len // config.pool**level
    expanded = (selection.level == level) & selection.expanded
    bins = evenness_bins(config, seq_len, level)
    bin_of = (selection.index.clamp(0, entries - 1) * bins) // entries
    counts = torch.zeros(*bin_of.shape[:-1], bins, dtype=torch.float64, device=bin_of.device)
    return counts.scatter_add_(-1, bin_of, expanded.double())


def _stats(gathered_len: int, histograms: dict[int, torch.Tensor], config: LighthouseConfig,
           seq_len: int) -> dict[str, torch.Tensor]:
    """The statistics from the per-level histograms of the whole sequence, averaged over batch and kv heads."""
    stats = {"S": torch.tensor(float(gathered_len))}
    for level, counts in histograms.items():
        stats[f"expanded_share/l{level}"] = counts.sum(-1).mean().cpu() / (seq_len // config.pool**level)
        stats[f"evenness/l{level}"] = normalized_entropy(counts).mean().cpu()
    return stats


@torch.no_grad()
def selection_stats(selection: Selection, config: LighthouseConfig, seq_len: int) -> dict[str, torch.Tensor]:
    """Scalar statistics of one layer call's Selection ([B, G, S] fields), averaged over batch and kv heads."""
    histograms = {level: expansion_histogram(selection, config, seq_len, level) for level in range(1, config.levels)}
    return _stats(selection.level.shape[-1], histograms, config, seq_len)


@torch.no_grad()
def shard_selection_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: LighthouseConfig,
                          mesh: DeviceMesh) -> dict[str, torch.Tensor]:
    """`selection_stats` of the whole sequence from this rank's head/tail shards under context parallelism.

    Each chunk selects on its own tiles (`shard_selections`); chunks are whole tiles, so their evenness bins
    are the whole sequence's bins, and the histograms all-gathered over the CP group give the single-device
    statistics on every rank. Every CP rank must call it (collectives).
    """
    chunk_len, cp_degree = q.shape[1] // 2, mesh.size()
    seq_len, local = 2 * chunk_len * cp_degree, chunk_config(config, cp_degree)
    selections = shard_selections(q, k, v, config, mesh)
    histograms = {}
    for level in range(1, config.levels):
        mine = torch.cat([expansion_histogram(sel, local, chunk_len, level) for sel in selections], dim=-1)
        everyone = all_gather_stacked(mine, mesh.get_group())  # [W, B, G, 2 * bins per chunk]
        histograms[level] = everyone.permute(1, 2, 0, 3).flatten(2)
    return _stats(config.gathered_len(seq_len), histograms, config, seq_len)


class SelectionStats:
    """Collects `selection_stats` per layer during a step; `summarize` averages them over calls and ranks."""

    def __init__(self) -> None:
        self._sums: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
        self._calls: dict[str, int] = defaultdict(int)

    def observer(self, layer: str, config: LighthouseConfig,
                 mesh: DeviceMesh | None = None) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]:
        """A callback for one attention layer with `config`: selects on its q, k, v and records the statistics.

        Under context parallelism (`mesh`, the CP mesh) q, k, v are this rank's shards and the statistics
        are those of the whole sequence (`shard_selection_stats`).
        """

        def observe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
            if mesh is None:
                stats = selection_stats(select(q, k, config, v=v), config, q.shape[1])
            else:
                stats = shard_selection_stats(q, k, v, config, mesh)
            sums = self._sums[layer]
            for name, value in stats.items():
                sums[name] = sums.get(name, 0.0) + value
            self._calls[layer] += 1

        return observe

    def summarize(self) -> dict[str, float]:
        """{'lighthouse/<stat>': mean over layers} plus 'lighthouse/evenness_min/l<l>' (worst layer), then reset.

        Every rank must call it (it all-reduces when torch.distributed is initialised); {} if nothing was recorded.
        """
        layers = sorted(self._sums)
        if not layers:
            return {}
        names = list(self._sums[layers[0]])
        table = torch.stack(
            [torch.stack([self._sums[layer][name] / self._calls[layer] for name in names]) for layer in layers]
        ).double()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            table = _all_reduce_mean(table)
        self._sums.clear()
        self._calls.clear()
        summary = {f"lighthouse/{name}": table[:, i].mean().item() for i, name in enumerate(names)}
        for i, name in enumerate(names):
            if name.startswith("evenness/"):
                summary[f"lighthouse/evenness_min/{name.split('/')[1]}"] = table[:, i].min().item()
        return summary


def _all_reduce_mean(table: torch.Tensor) -> torch.Tensor:
    """Mean over ranks, on the device the default process group communicates on."""
    device = torch.device("cpu") if "gloo" in dist.get_backend() else torch.accelerator.current_accelerator()
    reduced = table.to(device)
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced.cpu() / dist.get_world_size()


def attach_observers(model_parts: list[nn.Module], stats: SelectionStats | None) -> None:
    """Give every Lighthouse attention layer of the model an observer from `stats` (None detaches them); a
    layer whose Lighthouse call runs context parallel (its `inner_lighthouse` has a `mesh`) is observed on
    that mesh."""
    for part in model_parts:
        for name, module in part.named_modules():
            if getattr(module, "lighthouse", None) is None or not hasattr(module, "selection_observer"):
                continue
            mesh = getattr(module.inner_lighthouse, "mesh", None)
            module.selection_observer = stats.observer(name, module.lighthouse, mesh) if stats is not None else None
