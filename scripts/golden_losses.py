"""Per-step losses of a short CPU run of the debug config: the golden file that tests/test_crash_resume.py
compares every change against.

    python scripts/golden_losses.py                                          # print the record
    python scripts/golden_losses.py --write tests/golden/debug_losses.json   # regenerate the golden file

Regenerate the file only for a change that is meant to move the losses, and say so in its commit.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from eval.options import file_to_write
from recipe.logs.debug_run import golden_record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the debug config (`recipe.logs.debug_run`) and print its record or write it to --write."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=file_to_write, help="write the record to this JSON file (else print it)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        record = golden_record(Path(tmp) / "run")
    if args.write:
        record["regenerate"] = f"python scripts/golden_losses.py --write {args.write}"
        args.write.write_text(json.dumps(record, indent=1) + "\n")
    else:
        print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
