"""Parity of the fused GPU path with the pure-PyTorch reference, on the same GPU, at large sizes.

The checks of each case (selection, scores, layer, end to end, determinism): eval/benchmarks/gpu_parity.py.
Exits non-zero if any check fails. Usage: python scripts/gpu_parity.py [--quick]
"""
from __future__ import annotations

import argparse
import sys

from eval.device import require_cuda


def main() -> None:
    """Run the cases; exit code 1 if any failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the quick cases (eval.benchmarks.gpu_parity.QUICK)")
    args = parser.parse_args()
    require_cuda()
    from eval.benchmarks.gpu_parity import run_parity  # imports Triton: after the CUDA check

    sys.exit(0 if run_parity(args.quick) else 1)


if __name__ == "__main__":
    main()
