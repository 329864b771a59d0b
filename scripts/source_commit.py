"""The commit a measurement ran from, for the records benchmarks and evaluations write.

Defined in `recipe.run_record` (training runs record it too); this module keeps the scripts' import.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipe.run_record import source_commit  # noqa: E402

__all__ = ["source_commit"]
