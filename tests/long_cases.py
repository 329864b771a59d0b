"""The test cases that run longer than LONG_S seconds, read from a JUnit XML report of the whole suite on 2 CPU
cores: conftest.py marks each one `slow`, so `pytest -m "not slow"` is a quick inner loop while the full suite
(CI) still runs every case. A parametrized test whose every case is long keeps its quickest one in the inner loop.

    python -m pytest -n 2 --dist loadfile --junitxml=report.xml          # the whole suite, on 2 cores
    python -m tests.long_cases report.xml                                # print the list
    python -m tests.long_cases report.xml --write                        # replace tests/long_cases.txt
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

LONG_S = 3.0
LIST = Path(__file__).resolve().parent / "long_cases.txt"


def node_id(classname: str, name: str) -> str:
    """pytest's node id of a JUnit test case (`tests.test_x.Class` + `test_y[param]`)."""
    parts = classname.split(".")
    module = [p for p in parts if not p[:1].isupper()]
    classes = [p for p in parts if p[:1].isupper()]
    return "::".join(["/".join(module) + ".py", *classes, name])


def long_cases(durations: dict[str, float], quick: set[str], long_s: float = LONG_S) -> list[str]:
    """The ids in `quick` (not marked slow in the source) that took over `long_s`, less the quickest case of each
    parametrized function all of whose quick cases did."""
    by_function: dict[str, list[str]] = defaultdict(list)
    for case in quick & durations.keys():
        by_function[case.split("[")[0]].append(case)
    marked = []
    for cases in by_function.values():
        long = [c for c in cases if durations[c] > long_s]
        if len(long) == len(cases) > 1:
            long.remove(min(cases, key=durations.__getitem__))
        marked += long
    return sorted(marked)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="JUnit XML of the whole suite")
    parser.add_argument("--write", action="store_true", help=f"replace {LIST.name} (otherwise print the list)")
    args = parser.parse_args(argv)
    durations = {node_id(case.get("classname"), case.get("name")): float(case.get("time"))
                 for case in ET.parse(args.report).iter("testcase")}
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow",
                                "-p", "no:cacheprovider", "--ignore-long-cases"],
                               cwd=LIST.parent.parent, capture_output=True, text=True, check=True).stdout
    quick = {line.strip() for line in collected.splitlines() if "::" in line}
    text = "".join(case + "\n" for case in long_cases(durations, quick))
    if args.write:
        LIST.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
