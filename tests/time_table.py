"""Where the suite's time goes, per test file and notebook: ``tests/times.json``, written from one measured run.

    COURSE_TIME_TABLE=/tmp/raw.json make test        # the session writes each file's seconds there
    python tests/time_table.py /tmp/raw.json [/tmp/more.json ...] [--label "2-core CPU VM, quiet"] [--new-budgets]

A file a later session measured alone (a new test file) adds its rows; the wall time is the first one's.

The table keeps, for each file, the tests it ran, the seconds they took (setup, call and teardown, summed), the CPU
seconds they and the processes they started used (what a busier machine or more workers change far less) and a
budget; and the run's costliest tests by name, most CPU first (where a saving is worth looking for). Budgets
are the suite's contract: written once here (the first measurement, half again, rounded up to 10 s), changed by
hand when a file is meant to cost more; ``tests/test_suite_times.py`` holds every file to its budget and every
file to having one. Prints the table as Markdown, slowest first.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from datetime import date
from pathlib import Path

TABLE = Path(__file__).with_name("times.json")
# What make test should take on a quiet 2-core machine, in seconds of wall time (the goal), beside the measured.
WALL_TARGET_SECONDS = 35 * 60


def first_budget(seconds: float) -> int:
    """A new file's budget: what it took, half again, rounded up to 10 s (10 s at least)."""
    return max(10, int(math.ceil(seconds * 1.5 / 10) * 10))


def merged(measured: dict[str, dict], kept: dict[str, dict]) -> dict[str, dict]:
    """The new measurement, each file keeping the budget it had; files no longer measured are dropped."""
    return {path: {"tests": row["tests"], "seconds": row["seconds"], "cpu_seconds": row.get("cpu_seconds"),
                   "budget": kept.get(path, {}).get("budget") or first_budget(row["seconds"])}
            for path, row in sorted(measured.items())}


def markdown(files: dict[str, dict]) -> str:
    lines = ["| file | tests | seconds | CPU seconds | budget |", "| --- | ---: | ---: | ---: | ---: |"]
    for path, row in sorted(files.items(), key=lambda item: -item[1]["seconds"]):
        cpu = "" if row.get("cpu_seconds") is None else f"{row['cpu_seconds']:.0f}"
        lines.append(f"| {path} | {row['tests']} | {row['seconds']:.0f} | {cpu} | {row['budget']} |")
    total = sum(row["seconds"] for row in files.values())
    cpu_total = sum(row.get("cpu_seconds") or 0 for row in files.values())
    lines.append(f"| all {len(files)} files | {sum(row['tests'] for row in files.values())} | {total:.0f} | "
                 f"{cpu_total:.0f} | |")
    return "\n".join(lines)


def slowest_markdown(tests: list[dict]) -> str:
    lines = ["| test | seconds | CPU seconds |", "| --- | ---: | ---: |"]
    lines += [f"| {row['test']} | {row['seconds']:.0f} | {row['cpu_seconds']:.0f} |" for row in tests]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, nargs="+", help="the files COURSE_TIME_TABLE named, the whole run's first")
    parser.add_argument("--label", default="", help="the machine and how busy it was, e.g. '2-core VM, quiet'")
    parser.add_argument("--new-budgets", action="store_true",
                        help="every budget from this measurement: the way the suite runs changed (its workers)")
    args = parser.parse_args(argv)
    raws = []
    for path in args.raw:
        try:
            raw = json.loads(path.read_text())
            raws.append((raw["files"], raw["wall_seconds"], raw.get("slowest_tests", [])))
        except (OSError, ValueError, KeyError) as error:
            sys.exit(f"{path}: not a time table a test session wrote ({error}); run the suite with "
                     "COURSE_TIME_TABLE=PATH first")
    measured = {path: row for files, *_ in raws for path, row in files.items()}
    _, wall, slowest = raws[0]
    kept = json.loads(TABLE.read_text())["files"] if TABLE.exists() and not args.new_budgets else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=TABLE.parent).stdout.strip()
    files = merged(measured, kept)
    table = {"measured": {"date": date.today().isoformat(), "commit": commit, "machine": args.label,
                          "wall_seconds": wall},
             "wall_target_seconds": WALL_TARGET_SECONDS, "files": files, "slowest_tests": slowest}
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(markdown(files))
    if slowest:
        print("\n" + slowest_markdown(slowest))


if __name__ == "__main__":
    main()
