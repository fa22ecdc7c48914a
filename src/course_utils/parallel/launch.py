"""Start torchrun from a notebook cell, stream its output as it comes, end it cleanly (notebooks 06-09).

    result = launch(2, "course_utils.train", "--distributed", "ddp", "--max-steps", "20", "--out", "runs/ddp")
    result.returncode, result.rank_logs[1], result.per_rank   # per_rank: each rank's steps and timings

Every rank's output reaches the cell prefixed with its rank (torchrun's ``--tee``) and is kept per
rank under ``log_dir``. On failure the tail of each rank's log is printed. No process of a launch outlives it:
interrupting the cell, the time limit (``timeout_seconds``, else the course size's :func:`time_limit`), or a
rank's process left behind after torchrun exits, ends them all (:mod:`.launched_processes`), and the limit's error
says where each rank stood and which ones did not stop.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from course_utils import config
from course_utils.parallel import launched_processes
from course_utils.run_folder import RunFolder

TAIL_LINES = 20
# torchrun's failure report names each failed rank on a line of its own ("  rank      : 1 (local_rank: 1)") with
# its exit code below it ("  exitcode  : -15 (pid: 4242)"): first the other failures, then under "Root Cause" the
# first one. A rank's own lines reach the output prefixed ("[default1]:"), so they never match.
REPORTED_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
REPORTED_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
ENDED_BY_TORCHRUN = -15  # SIGTERM: torchrun's own signal to the ranks still running after the first failure
TRACEBACK = "Traceback (most recent call last)"

# The longest a launch may run, in seconds, per course size: a rank that never exits (a deadlock at the end of a
# run) fails the cell with its rank named instead of hanging it. COURSE_LAUNCH_TIMEOUT sets another limit.
TIME_LIMITS = {"ci": 20 * 60, "workshop": 12 * 3600}
LIMIT_VARIABLE = "COURSE_LAUNCH_TIMEOUT"


def time_limit() -> float:
    """The time limit of a launch that names none: ``COURSE_LAUNCH_TIMEOUT`` seconds, else the course size's."""
    value = os.environ.get(LIMIT_VARIABLE)
    if not value:
        return TIME_LIMITS[config.active_size_name()]
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{LIMIT_VARIABLE}={value!r} is not a positive number of seconds; set one such as 3600, "
                         f"or unset it for the course size's limit ({TIME_LIMITS})")
    return seconds


def _checked_limit(seconds: float) -> float:
    """A limit a launch can keep: nan would mean none at all, zero or less a timeout at once."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"timeout_seconds={seconds!r}: a launch's time limit is a positive number of seconds")
    return float(seconds)


@dataclass
class LaunchResult:
    returncode: int
    lines: list[str] = field(default_factory=list)  # everything torchrun printed, in order
    rank_logs: dict[int, str] = field(default_factory=dict)  # rank -> its stdout and stderr
    summary: dict | None = None  # the run's summary.json, when the module was the training command with --out

    @property
    def per_rank(self) -> pd.DataFrame:
        """One row per rank: its iteration count, images and timings, from the run's summary."""
        return pd.DataFrame((self.summary or {}).get("per_rank", []))

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def failed_ranks(self) -> list[int]:
        """The ranks that failed on their own: the first failure of torchrun's report, then the others it
        reports that torchrun did not end itself (SIGTERM after the first failure), then any other whose log
        holds a Python traceback. Empty when every rank ended cleanly, or when torchrun failed before any rank
        ran (a bad flag, a missing script): ``ok`` tells those apart."""
        root, others = [], []
        reported, rank = others, None
        for line in self.lines if not self.ok else []:
            if line.startswith("Root Cause"):
                reported = root
            elif match := REPORTED_RANK.match(line):
                rank = int(match[1])
            elif (match := REPORTED_EXIT.match(line)) and rank is not None:
                if int(match[1]) != ENDED_BY_TORCHRUN or reported is root:
                    reported.append(rank)
                rank = None
        raised = [rank for rank, text in sorted(self.rank_logs.items()) if TRACEBACK in text]
        return list(dict.fromkeys(root + others + raised))


# "--" ends torchrun's own options: without it, torchrun's parser takes a module's flag that begins like one
# of its own (--monitor, like --monitor-interval) for an abbreviation and fails. torchrun drops the "--".
SCRIPT_ARGS = ("--",)


def torchrun_command(nproc: int, module: str, args: tuple[str, ...], log_dir: Path, max_restarts: int = 0) -> list[str]:
    """``module`` is a module's name, or the path of a script (``.py``), as a notebook writes one."""
    target = [module] if module.endswith(".py") else ["-m", module]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--tee=3", f"--log-dir={log_dir}", *target, *SCRIPT_ARGS, *args]


def _rank_logs(log_dir: Path, earlier: set[Path]) -> dict[int, str]:
    """torchrun keeps each rank's output under ``log_dir/<run>/attempt_<n>/<rank>/std{out,err}.log``, a new
    ``<run>`` per launch: the runs in ``earlier`` (launches before this one into the same folder) are left out."""
    logs: dict[int, str] = {}
    for run in sorted(set(log_dir.iterdir()) - earlier) if log_dir.is_dir() else []:
        for path in sorted(run.rglob("std*.log")):
            rank = int(path.parent.name)
            logs[rank] = logs.get(rank, "") + path.read_text(errors="replace")
    return logs


def _out_dir(args: tuple[str, ...]) -> Path | None:
    """The folder given to ``--out`` (``--out DIR`` or ``--out=DIR``), if any."""
    for index, arg in enumerate(args):
        if arg == "--out" and index + 1 < len(args):
            return Path(args[index + 1])
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1])
    return None


def last_lines(log_dir: Path) -> dict[int, str]:
    """Rank -> the last line (not blank) it wrote to stdout or stderr, whichever it wrote last, in its latest
    attempt: read from its log files, which it writes itself, as the line streamed to the cell may lag."""
    found: dict[int, str] = {}
    logs = [path for path in Path(log_dir).rglob("std*.log") if path.parent.name.isdigit()]
    for path in sorted(logs, key=lambda path: path.stat().st_mtime_ns):
        with open(path, "rb") as stream:
            stream.seek(max(0, path.stat().st_size - 4096))
            lines = [line.strip() for line in stream.read().decode(errors="replace").splitlines() if line.strip()]
        if lines:
            found[int(path.parent.name)] = lines[-1]
    return found


LAUNCHER_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"


class LauncherTraceback:
    """Leaves torchrun's own traceback out of what the cell shows when it ends in its ``ChildFailedError``: 25 lines
    of the launcher's internals above the report that names the failed rank, which the learner reads instead.
    Every line is still kept in the launch's result; any other traceback of torchrun's is shown whole."""

    def __init__(self) -> None:
        self.held: list[str] = []

    def shown(self, line: str) -> list[str]:
        """The lines to show now, given the next line of torchrun's output."""
        if not self.held:
            if line.startswith(TRACEBACK):
                self.held = [line]
                return []
            return [line]
        if line.startswith((" ", "\t", "[default")):  # a frame, or a rank's line between them
            if not line.startswith("[default"):
                self.held.append(line)
                return []
            return [line]
        held, self.held = self.held, []
        if line.startswith(LAUNCHER_FAILED):
            return [f"(torchrun's own traceback left out: {len(held)} lines; its report below names the failed "
                    "rank)\n", line]
        return [*held, line]


def _forward(stream, lines: list[str], echo: bool) -> None:
    launcher_traceback = LauncherTraceback()
    for line in stream:
        lines.append(line.rstrip("\n"))
        if echo:
            for shown in launcher_traceback.shown(line):
                print(shown, end="", flush=True)
    if echo:
        print("".join(launcher_traceback.held), end="", flush=True)  # a traceback the output ended inside


def remove_outputs(paths: Iterable[str | Path]) -> None:
    """Remove what an earlier launch wrote to ``paths`` (a file, or a folder's contents: the folder stays), so that
    whatever a cell reads after a launch is that launch's, or nothing: never an earlier attempt's."""
    for path in map(Path, paths):
        if path.is_dir():
            shutil.rmtree(path)
            path.mkdir()
        else:
            path.unlink(missing_ok=True)


def launch(nproc: int, module: str, *args: str, log_dir: Path | None = None,
           timeout_seconds: float | None = None, echo: bool = True, max_restarts: int = 0,
           env: dict[str, str] | None = None, outputs: Iterable[str | Path] = ()) -> LaunchResult:
    """Run ``torchrun --standalone --nproc-per-node nproc -m module args...`` (or ``script.py args...``) and
    wait for it.

    ``max_restarts``: when a rank fails, torchrun ends the others and starts them all again, up to
    this many times (with ``--resume auto`` the training continues from its last checkpoint).
    ``env``: variables set for the ranks besides this process's own (``NCCL_DEBUG=INFO``...).
    ``outputs``: the files or folders the script writes, emptied first (:func:`remove_outputs`).
    ``timeout_seconds``: the time limit (default :func:`time_limit`), a positive number of seconds; past it every
    process of the launch is ended and a ``TimeoutError`` says where each rank stood and which did not stop.
    ``log_dir``: where torchrun keeps each rank's log; without one, a temporary folder of the launch's own, removed
    once the logs are read into the result (kept after a time limit or an interrupt, whose message names it).
    """
    timeout_seconds = _checked_limit(time_limit() if timeout_seconds is None else timeout_seconds)
    remove_outputs(outputs)
    own_logs = log_dir is None
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="torchrun-"))
    command = torchrun_command(nproc, module, args, log_dir, max_restarts)
    earlier = set(log_dir.iterdir()) if log_dir.is_dir() else set()
    launched = launched_processes.Launch()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                               start_new_session=True, env={**os.environ, **(env or {}), **launched.marker})
    launched.started.append(process)
    result = LaunchResult(returncode=-1)
    # A thread forwards the output, so that the wait below can time out even while the ranks are silent.
    reader = threading.Thread(target=_forward, args=(process.stdout, result.lines, echo), daemon=True)
    reader.start()
    try:
        result.returncode = process.wait(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"torchrun ran past its limit of {timeout_seconds:g} s, and was ended: "
                           f"{launched.end(last_lines(log_dir))} (the logs are in {log_dir})") from None
    except KeyboardInterrupt:
        print(f"interrupted: {launched.end(last_lines(log_dir))} (the logs are in {log_dir})", file=sys.stderr)
        raise
    finally:
        launched.end_leftovers()
        reader.join(timeout=10)
        process.stdout.close()
    result.rank_logs = _rank_logs(log_dir, earlier)
    if own_logs:  # every launch of a notebook would otherwise leave one in the system's temporary folder
        shutil.rmtree(log_dir, ignore_errors=True)
    out = _out_dir(args)
    folder = RunFolder(out) if out is not None else None
    if result.ok and folder is not None and folder.summary.is_file():
        result.summary = folder.read_summary()
    if not result.ok and echo:
        for rank, text in sorted(result.rank_logs.items()):
            tail = "\n".join(text.splitlines()[-TAIL_LINES:])
            print(f"--- rank {rank}: last {TAIL_LINES} lines of its log ---\n{tail}", file=sys.stderr)
    return result
