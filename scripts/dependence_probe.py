"""How far back a later token reaches through one Lighthouse layer, per selection mode (eval.metrics.dependence).

    python scripts/dependence_probe.py [--selection causal,strict,paper] [--positions 32] [--seed 0]
    python scripts/dependence_probe.py --overlap 65536  (share of causal's expanded entries strict expands too)

For each probe geometry (GQA and MHA, L = 2..4, p = 2..8, the norm and dilated scorers), k and v at random
later positions j are replaced and the reference layer runs again in float64 on the CPU; the table counts the
earlier rows whose output moved in any bit, and those whose output or input gradient did (loss on the rows
< j), with the largest distance j - t. Prints a markdown table; writes nothing.

With --overlap N it instead selects once in "causal" and once in "strict" on random float32 inputs of N tokens
(L3 p4 k512 m128, H4 G2) and prints, per level, the share of causal's expanded entries that strict expands too.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from eval.metrics.dependence import reach
from eval.options import non_negative_int, positive_int, selection_list, torch_seed
from lighthouse import select
from lighthouse.config import SELECTIONS, LighthouseConfig

# (name, config without its selection, N, query heads, kv heads)
GEOMETRIES = [
    ("L2 p8 k4 m2, H4 G2", LighthouseConfig(levels=2, pool=8, topk=4, tile_budget=2), 64, 4, 2),
    ("L3 p4 k8 m2, H4 G2", LighthouseConfig(levels=3, pool=4, topk=8, tile_budget=2), 256, 4, 2),
    ("L4 p2 k8 m4, H2 G2", LighthouseConfig(levels=4, pool=2, topk=8, tile_budget=4), 128, 2, 2),
    ("L3 p2 k4 m2 dilated, H4 G1", LighthouseConfig(levels=3, pool=2, topk=4, tile_budget=2, scorer="dilated",
                                                    dilation=2), 64, 4, 1),
    ("L3 p4 k32 m8, H4 G2", LighthouseConfig(levels=3, pool=4, topk=32, tile_budget=8), 512, 4, 2),
]


# The selection --overlap runs on N tokens, once "causal" and once "strict".
OVERLAP_CONFIG = LighthouseConfig(levels=3, pool=4, topk=512, tile_budget=128, selection="causal")


def overlap_length(text: str) -> int:
    """argparse type of --overlap: 0 (no comparison) or a length N that OVERLAP_CONFIG can select on (a multiple of
    pool**(levels-1) = 16 whose coarsest entries fill topk/tile_budget tiles of at least tile_budget entries);
    another failed with LighthouseConfig's traceback once the inputs were drawn."""
    n = non_negative_int(text)
    if n:
        try:
            OVERLAP_CONFIG.validate(n)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"N={n} does not fit the selection it compares (L3 p4 k512 m128): "
                                             f"{err}") from None
    return n


def overlap(n: int, seed: int) -> None:
    """Per level, the share of causal's expanded entries of one (batch, kv-head) row that strict expands too."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, n, 4, 16, generator=gen), torch.randn(1, n, 2, 16, generator=gen)
    causal, strict = (select(q, k, dataclasses.replace(OVERLAP_CONFIG, selection=mode))
                      for mode in ("causal", "strict"))
    for lvl in range(1, OVERLAP_CONFIG.levels):
        a, b = (set(s.index[0, 0][(s.level[0, 0] == lvl) & s.expanded[0, 0]].tolist()) for s in (causal, strict))
        print(f"level {lvl}: {len(a & b) / len(a):.3f} of causal's {len(a)} expanded entries also expanded by strict")


def main() -> None:
    """Probe every geometry in every requested mode and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selection", type=selection_list, default=["causal", "strict"],
                        help=f"comma-separated modes among {','.join(SELECTIONS)}")
    parser.add_argument("--positions", type=positive_int, default=32, help="later positions j probed per geometry")
    parser.add_argument("--seed", type=torch_seed, default=0, help="seed of the inputs, positions and perturbations")
    parser.add_argument("--overlap", type=overlap_length, default=0,
                        help="N: compare strict's expanded entries with causal's (N a multiple of 64, >= 8192)")
    args = parser.parse_args()
    if args.overlap:
        overlap(args.overlap, args.seed)
        return
    print("| geometry | N | selection | positions | leaking | output rows moved | max distance | "
          "output or gradient rows moved | max distance |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, config, n, heads, kv_heads in GEOMETRIES:
        for mode in args.selection:
            gen = torch.Generator().manual_seed(args.seed)
            q, k, v = (torch.randn(2, n, h, 8, dtype=torch.float64, generator=gen) for h in (heads, kv_heads, kv_heads))
            positions = (torch.randperm(n - 1, generator=gen)[: args.positions] + 1).tolist()
            r = reach(q, k, v, dataclasses.replace(config, selection=mode), positions, gen)
            print(f"| {name} | {n} | {mode} | {r.positions} | {r.leaking_positions} | {r.output_rows} | "
                  f"{r.output_distance} | {r.any_rows} | {r.any_distance} |")


if __name__ == "__main__":
    main()
