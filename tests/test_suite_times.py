"""The suite's own time table (``tests/times.json``, written by ``tests/time_table.py`` from a measured run): every
test file and notebook has a row with a budget, the measured run kept each file within its budget, and the
table is about this checkout's files, not a past one's. The whole run's wall time stands beside its target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from time_table import TABLE, first_budget, markdown, merged, slowest_markdown

ROOT = Path(__file__).resolve().parents[1]
REMEASURE = ("measure the suite again: COURSE_TIME_TABLE=/tmp/raw.json make test, then "
             "python tests/time_table.py /tmp/raw.json")


@pytest.fixture(scope="module")
def table() -> dict:
    return json.loads(TABLE.read_text())


def _suite_files() -> set[str]:
    return ({str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")}
            | {str(path.relative_to(ROOT)) for path in (ROOT / "notebooks").glob("*.ipynb")})


def test_every_test_file_and_notebook_has_a_row_and_no_row_is_of_a_file_gone(table):
    rows = set(table["files"])
    assert not _suite_files() - rows, f"no time measured for {sorted(_suite_files() - rows)}: {REMEASURE}"
    assert not rows - _suite_files(), f"rows of files that are gone: {sorted(rows - _suite_files())}: {REMEASURE}"


def test_the_measured_run_kept_every_file_within_its_budget(table):
    over = {path: (row["seconds"], row["budget"]) for path, row in table["files"].items()
            if row["seconds"] > row["budget"]}
    assert not over, f"files over their budget (seconds, budget): {over}"


def test_a_new_file_gets_a_budget_of_its_measure_and_half_again_and_an_old_one_keeps_its_own():
    rows = merged({"tests/test_new.py": {"tests": 3, "seconds": 41.0, "cpu_seconds": 60.5},
                   "tests/test_old.py": {"tests": 5, "seconds": 12.0, "cpu_seconds": 3.0}},
                  {"tests/test_old.py": {"tests": 4, "seconds": 9.0, "cpu_seconds": 2.0, "budget": 30},
                   "tests/test_gone.py": {"tests": 1, "seconds": 1.0, "cpu_seconds": 1.0, "budget": 10}})
    assert rows == {"tests/test_new.py": {"tests": 3, "seconds": 41.0, "cpu_seconds": 60.5,
                                          "budget": first_budget(41.0)},
                    "tests/test_old.py": {"tests": 5, "seconds": 12.0, "cpu_seconds": 3.0, "budget": 30}}
    assert first_budget(41.0) == 70
    lines = markdown(rows).splitlines()
    assert lines[2].startswith("| tests/test_new.py | 3 | 41 | 60 | 70 |")
    assert lines[-1] == "| all 2 files | 8 | 53 | 64 | |"


def test_the_costliest_tests_are_listed_by_name_with_their_seconds():
    measured = [{"test": "tests/test_a.py::test_one", "seconds": 80.4, "cpu_seconds": 120.6}]
    lines = slowest_markdown(measured).splitlines()
    assert lines == ["| test | seconds | CPU seconds |", "| --- | ---: | ---: |",
                     "| tests/test_a.py::test_one | 80 | 121 |"]
