"""Check backend="flash_attn" beside cuDNN on one GPU: parity, a training step's loss, latency, `auto`'s rule.

Whether FlashAttention-4 imports, parity of the attention and of the Lighthouse layer, one training step's loss,
latency at 32K / 128K / 512K, and attention alone from 4K to 128K: where `backend = "auto"` should take it.

What it measures and writes: eval/benchmarks/flash_attn_check.py. Exits 1 if flash_attn did not import or missed a
parity tolerance.

Usage: python scripts/flash_attn_check.py --out outputs/flash_attn  [--replot]  (--replot: only draw the PNG from the
       folder's record; docs/records/ holds the published one)
"""
from __future__ import annotations

import argparse
import sys

from eval.options import output_folder, read_json
from recipe.errors import exit_on_config_error


def main() -> None:
    """Parse the options; run the check (or only draw the plot)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_folder, required=True,
                        help="folder for flash_attn_check.json and flash_attn_bench.png")
    parser.add_argument("--replot", action="store_true",
                        help="only draw flash_attn_bench.png from the folder's flash_attn_check.json (no GPU)")
    args = parser.parse_args()
    if args.replot:
        from eval.benchmarks.flash_attn_check import RECORD_KEYS, replot

        record = read_json(args.out / "flash_attn_check.json", "--replot --out",
                           f"a record of this script (an object with {', '.join(RECORD_KEYS)})",
                           lambda value: isinstance(value, dict) and all(key in value for key in RECORD_KEYS))
        replot(record, args.out)
        return
    from eval.device import require_cuda

    require_cuda()
    from eval.benchmarks.flash_attn_check import run_check  # imports Triton: after the CUDA check

    sys.exit(0 if run_check(args.out) else 1)


if __name__ == "__main__":
    with exit_on_config_error():
        main()
