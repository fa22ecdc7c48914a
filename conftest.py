"""Test-wide settings: no person watches the notebooks that nbval runs, the size is ``ci``, what the course keeps
between processes (the generated data's sums) goes to a folder of the session's own, and so does everything the
suite's processes put in the system's temporary folder (job scripts' private folders, torchrun's logs, the
compiler's cache): one folder, removed when the session ends. With ``COURSE_TIME_TABLE=PATH`` the session writes
where its time went, per test file and notebook, unless PATH exists (``tests/time_table.py`` makes the table)."""

import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

SESSION_TEMPORARY = Path(tempfile.mkdtemp(prefix="course-tests-"))
SESSION_TEMPORARY.chmod(0o1777)  # as the system's own: other users' tests make folders in it too (sticky)
os.environ["TMPDIR"] = str(SESSION_TEMPORARY)  # every process the tests start inherits it
tempfile.tempdir = None  # and this one reads it again
os.environ["COURSE_INTERACTIVE"] = "0"  # no TensorBoard servers or live widgets under pytest
os.environ.setdefault("COURSE_SIZE", "ci")
os.environ.setdefault("COURSE_CACHE_DIR", tempfile.mkdtemp(prefix="course-cache-"))

_STARTED = time.monotonic()
_seconds_per_file: defaultdict[str, float] = defaultdict(float)
_tests_per_file: defaultdict[str, int] = defaultdict(int)


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    _seconds_per_file[path] += report.duration
    _tests_per_file[path] += report.when == "call"


def pytest_sessionfinish(session, exitstatus) -> None:
    destination = os.environ.get("COURSE_TIME_TABLE")
    if not destination or Path(destination).exists():  # the first session writes: in .ci/run, make test's
        return
    files = {path: {"seconds": round(seconds, 1), "tests": _tests_per_file[path]}
             for path, seconds in sorted(_seconds_per_file.items())}
    wall = round(time.monotonic() - _STARTED)
    Path(destination).write_text(json.dumps({"wall_seconds": wall, "files": files}, indent=1) + "\n")


def pytest_unconfigure(config) -> None:
    shutil.rmtree(SESSION_TEMPORARY, ignore_errors=True)
