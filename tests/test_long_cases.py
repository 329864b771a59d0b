"""tests/long_cases.py: which quick cases the inner loop leaves to the full suite."""
from pathlib import Path

from tests.long_cases import LIST, long_cases, node_id


def test_long_cases_are_marked_and_a_parametrized_test_keeps_its_quickest_case():
    durations = {"t.py::a[1]": 0.5, "t.py::a[2]": 9.0,      # one quick case: the long one goes
                 "t.py::b[1]": 4.0, "t.py::b[2]": 7.0,      # every case long: the quickest stays
                 "t.py::c": 12.0, "t.py::d": 0.1,            # a single long case goes; a quick one stays
                 "t.py::e": 30.0}                            # already slow in the source: not listed
    quick = set(durations) - {"t.py::e"}
    assert long_cases(durations, quick) == ["t.py::a[2]", "t.py::b[2]", "t.py::c"]


def test_junit_names_become_pytest_node_ids():
    assert node_id("tests.kernels.test_gather", "test_x[N128-p2]") == "tests/kernels/test_gather.py::test_x[N128-p2]"
    assert node_id("tests.test_slurm.TestLaunch", "test_y") == "tests/test_slurm.py::TestLaunch::test_y"


def test_every_listed_case_names_a_test_function_of_the_suite():
    root = LIST.parent.parent
    for case in LIST.read_text().splitlines():  # one case a line: an id may hold spaces
        path, *_, name = case.split("::")
        assert f"def {name.split('[')[0]}(" in (root / path).read_text(), case
