"""Test-wide settings: no person watches the notebooks that nbval runs, the size is ``ci``, what the course keeps
between processes (the generated data's sums) goes to a folder of the session's own, and so does everything the
suite's processes put in the system's temporary folder (job scripts' private folders, torchrun's logs, the
compiler's cache): one folder, removed when the session ends. With ``COURSE_TIME_TABLE=PATH`` the session writes
where its time went, per test file and notebook and for its costliest tests, unless PATH exists
(``tests/time_table.py`` makes the table): wall seconds, and the CPU seconds of the tests and of the processes they
started and saw end, which a busier machine changes far less. On pytest-xdist's workers (``make test``) the files
run longest first, as that table measured."""

import atexit
import json
import os
import resource
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

SESSION_TEMPORARY = Path(tempfile.mkdtemp(prefix="course-tests-"))
SESSION_TEMPORARY.chmod(0o1777)  # as the system's own: other users' tests make folders in it too (sticky)
os.environ["TMPDIR"] = str(SESSION_TEMPORARY)  # every process the tests start inherits it
tempfile.tempdir = None  # and this one reads it again
# Removed when the process ends, however the session ended (a usage error ends it before pytest_configure).
atexit.register(shutil.rmtree, SESSION_TEMPORARY, ignore_errors=True)
# OpenMP's threads in every process the suite starts (PyTorch's intra-op pool) sleep while they wait instead of
# spinning: the suite runs many processes on few cores, where a spinning thread takes the core from the process
# it waits for (on 2 cores, three trainings at once: 46 s wall spinning, 34 s sleeping; one alone: 18 s and 14 s).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# And one such thread per process, as torchrun gives each CPU rank: with three test processes on two cores a second
# thread only adds the cost of sharing the work (notebook 02 on 2 cores alone: 100 CPU s with 2 threads, 88 with 1;
# notebook 05: 114 and 106). Set before any test process imports PyTorch, which reads it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["COURSE_INTERACTIVE"] = "0"  # no TensorBoard servers or live widgets under pytest
os.environ.setdefault("COURSE_SIZE", "ci")
os.environ.setdefault("COURSE_CACHE_DIR", tempfile.mkdtemp(prefix="course-cache-"))

TIMES = Path(__file__).with_name("tests") / "times.json"
# Where a file the table has not measured yet goes in the order: among the middling ones.
UNMEASURED_SECONDS = 60.0
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... on a worker; None in a run without workers

_STARTED = time.monotonic()
_seconds_per_file: defaultdict[str, float] = defaultdict(float)
_tests_per_file: defaultdict[str, int] = defaultdict(int)
_cpu_per_file: defaultdict[str, float] = defaultdict(float)
_per_test: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # test id -> [seconds, CPU seconds]
SLOWEST_TESTS = 60  # the tests the table lists by name, most CPU first: where a saving is worth looking for
CPU = "cpu_seconds"  # the report's property that carries a phase's CPU time from a worker to the controller


def _cpu_seconds() -> float:
    """The CPU time of this process and of every process it started and saw end (with theirs, recursively)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_cpu_mark = [_cpu_seconds()]


def pytest_collection_modifyitems(config, items) -> None:
    """Longest file first, each file's items in their own order (a notebook's cells too). ``make test`` hands whole
    files to its workers in this order (``--dist loadfile --no-loadscope-reorder``): the long files start at once and
    the short ones fill the end, instead of a long one starting last while the other workers wait for it."""
    if WORKER is None:
        return
    measured = {path: row["seconds"] for path, row in json.loads(TIMES.read_text())["files"].items()}
    items.sort(key=lambda item: -measured.get(item.nodeid.split("::")[0], UNMEASURED_SECONDS))


def pytest_runtest_logstart(nodeid, location) -> None:
    _cpu_mark[0] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    now = _cpu_seconds()
    report.user_properties.append((CPU, now - _cpu_mark[0]))
    _cpu_mark[0] = now
    return report


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    _seconds_per_file[path] += report.duration
    _tests_per_file[path] += report.when == "call"
    cpu = sum(value for name, value in report.user_properties if name == CPU)
    _cpu_per_file[path] += cpu
    _per_test[report.nodeid][0] += report.duration
    _per_test[report.nodeid][1] += cpu


def pytest_sessionfinish(session, exitstatus) -> None:
    destination = os.environ.get("COURSE_TIME_TABLE")
    if WORKER is not None:  # the controller hears every worker's reports and writes the table
        return
    if not destination or Path(destination).exists():  # the first session writes: in .ci/run, make test's
        return
    files = {path: {"seconds": round(seconds, 1), "cpu_seconds": round(_cpu_per_file[path], 1),
                    "tests": _tests_per_file[path]}
             for path, seconds in sorted(_seconds_per_file.items())}
    slowest = sorted(_per_test.items(), key=lambda item: -item[1][1])[:SLOWEST_TESTS]
    tests = [{"test": test, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1)}
             for test, (seconds, cpu) in slowest]
    wall = round(time.monotonic() - _STARTED)
    Path(destination).write_text(json.dumps({"wall_seconds": wall, "files": files, "slowest_tests": tests},
                                            indent=1) + "\n")
