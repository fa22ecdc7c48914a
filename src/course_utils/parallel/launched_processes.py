"""Every process of one torchrun launch, found and ended together (notebooks 06-09: through :mod:`.launch`, and
08's cloud VMs).

torchrun starts each rank in a session of its own, so a signal to torchrun's process group reaches neither
the ranks nor their DataLoader workers, and a rank left behind runs on (until its process group's timeout, or
forever when it is stopped), holding its GPU's memory. A launch therefore marks its processes:
``COURSE_LAUNCH_ID`` in torchrun's environment, which its ranks inherit and their workers from them. Ending a
launch sends SIGTERM to every marked process and to its process group, SIGCONT after it (a stopped process acts
on a signal only when it runs again), waits, and SIGKILLs what is left; it says where each rank stood and
which ones did not stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil

MARKER = "COURSE_LAUNCH_ID"
GRACE_SECONDS = 10.0  # a rank's time to act on SIGTERM (finish its step, checkpoint) before SIGKILL
KILL_SECONDS = 10.0  # how long SIGKILL may take before a process is reported as still there
POLL_SECONDS = 0.05

# psutil's names of a process's state, as a learner reads them.
STATES = {psutil.STATUS_SLEEPING: "waiting", psutil.STATUS_DISK_SLEEP: "waiting for the disk",
          psutil.STATUS_STOPPED: "stopped (SIGSTOP or Ctrl-Z)", psutil.STATUS_TRACING_STOP: "stopped by a debugger",
          psutil.STATUS_ZOMBIE: "exited"}


@dataclass(frozen=True)
class RankStand:
    """Where one rank stood when its launch was ended: its state and the last line it printed."""

    rank: int
    pid: int
    state: str
    last_line: str

    def __str__(self) -> str:
        said = f"last printed {self.last_line!r}" if self.last_line else "had printed nothing"
        return f"rank {self.rank} (pid {self.pid}) was {self.state} and {said}"


@dataclass
class Ending:
    """What ending a launch found and did."""

    stands: list[RankStand] = field(default_factory=list)  # every rank still running, before the first signal
    killed: list[RankStand] = field(default_factory=list)  # ranks that did not stop within the grace time
    others_killed: int = 0  # other processes that needed SIGKILL (torchrun, loader workers)
    left: list[int] = field(default_factory=list)  # pids still there after SIGKILL
    grace_seconds: float = GRACE_SECONDS

    def __str__(self) -> str:
        if not self.stands:
            told = "no rank was running"
        else:
            told = "where each rank stood: " + "; ".join(map(str, self.stands))
        if self.killed:
            ranks = ", ".join(f"rank {stand.rank} (pid {stand.pid})" for stand in self.killed)
            told += f". {ranks} did not stop within {self.grace_seconds:g} s of SIGTERM and had to be killed (SIGKILL)"
        if self.left:
            pids = " ".join(map(str, self.left))
            return (f"{told}. Still running after SIGKILL: pid {pids} (blocked in the kernel, on a disk or a "
                    f"device); end them with `kill -9 {pids}` or ask the system's administrators")
        return f"{told}. Every process of the launch has ended"


def same_user(process: psutil.Process) -> bool:
    """Whether ``process`` runs as this process's user: the only processes a launch ends or the doctor reads."""
    try:
        return process.uids().real == os.getuid()
    except (psutil.Error, AttributeError):  # AttributeError: a system without user ids
        return False


def environment(process: psutil.Process) -> dict[str, str]:
    """The process's environment variables; none where it has gone or is another user's."""
    try:
        return process.environ()
    except psutil.Error:
        return {}


def find(launch_id: str, started: list[subprocess.Popen]) -> list[psutil.Process]:
    """The processes of one launch: those marked with ``launch_id`` and the descendants of the launchers in
    ``started`` (torchrun) not reaped yet (until then their pids cannot belong to other processes), which a
    rank that set its own environment would otherwise hide."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter():
        if same_user(process) and environment(process).get(MARKER) == launch_id:
            found[process.pid] = process
    for launcher in started:
        if launcher.returncode is None:
            try:
                top = psutil.Process(launcher.pid)
                found.update({process.pid: process for process in [top, *top.children(recursive=True)]})
            except psutil.Error:
                continue
    return [process for process in found.values() if _running(process)]


def ranks(processes: Iterable[psutil.Process], launchers: set[int] = frozenset()) -> dict[int, int]:
    """pid -> rank of the ranks among ``processes``: those that carry ``RANK`` and whose parent does not (torchrun,
    or whoever adopted the rank when torchrun died), or is one of the running ``launchers`` (torchrun's pid, which
    carries a ``RANK`` of its own when the notebook's kernel has one). A DataLoader worker inherits its rank's
    ``RANK``, its parent has it too: not a rank of its own."""
    carrying = {}
    for process in processes:
        rank = environment(process).get("RANK")
        if rank is not None and rank.isdigit():
            carrying[process.pid] = (process, int(rank))
    found = {}
    for pid, (process, rank) in carrying.items():
        try:
            parent = process.ppid()
        except psutil.Error:
            continue
        if pid not in launchers and (parent in launchers or parent not in carrying):
            found[pid] = rank
    return found


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (an exited process its parent has not reaped yet holds nothing)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _state(process: psutil.Process) -> str:
    try:
        status = process.status()
    except psutil.Error:
        return "exited"
    return STATES.get(status, status)


def _signal(processes: list[psutil.Process], number: signal.Signals) -> None:
    """``number`` to each process and to each of their process groups (which holds what a process started without
    the marker); never to this process's own group."""
    own_group = os.getpgrp()
    groups = set()
    for process in processes:
        try:
            groups.add(os.getpgid(process.pid))
            process.send_signal(number)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    for group in groups - {own_group}:
        try:
            os.killpg(group, number)
        except (ProcessLookupError, PermissionError):
            continue


def _wait(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while (alive := [process for process in processes if _running(process)]) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return alive


def end(started: list[subprocess.Popen], launch_id: str, last_lines: dict[int, str],
        grace_seconds: float = GRACE_SECONDS) -> Ending:
    """End every process of the launch whose launchers (torchrun, one per node) are ``started``: SIGTERM (and
    SIGCONT), up to ``grace_seconds`` to stop, then SIGKILL. ``last_lines``: rank -> the last line it printed. A
    Ctrl-C during the grace time goes straight to SIGKILL."""
    processes = find(launch_id, started)
    launchers = {launcher.pid for launcher in started if launcher.poll() is None}
    by_pid = {process.pid: process for process in processes}
    ending = Ending(grace_seconds=grace_seconds)
    ending.stands = sorted((RankStand(rank, pid, _state(by_pid[pid]), last_lines.get(rank, ""))
                            for pid, rank in ranks(processes, launchers).items()),
                           key=lambda stand: stand.rank)
    _signal(processes, signal.SIGTERM)
    _signal(processes, signal.SIGCONT)
    try:
        alive = _wait(processes, grace_seconds)
    except KeyboardInterrupt:  # asked twice: no more waiting
        alive = [process for process in processes if _running(process)]
    # Anything the ranks started meanwhile (a loader's new workers) goes too.
    alive += [process for process in find(launch_id, started) if process.pid not in by_pid]
    if alive:
        stubborn = {process.pid for process in alive}
        ending.killed = [stand for stand in ending.stands if stand.pid in stubborn]
        ending.others_killed = len(stubborn) - len(ending.killed)
        _signal(alive, signal.SIGKILL)
        ending.left = sorted(process.pid for process in _wait(alive, KILL_SECONDS))
    for launcher in started:
        try:
            launcher.wait(timeout=KILL_SECONDS)  # reaped, not left a zombie
        except subprocess.TimeoutExpired:
            ending.left = sorted({*ending.left, launcher.pid})
    return ending


class Launch:
    """The processes of one launch: :attr:`marker` goes into the environment of its launchers, each appended to
    :attr:`started`; :meth:`end` ends them all, once."""

    def __init__(self) -> None:
        self.marker = {MARKER: uuid.uuid4().hex}
        self.started: list[subprocess.Popen] = []
        self.ending: Ending | None = None

    def end(self, last_lines: dict[int, str] | None = None) -> Ending:
        if self.ending is None:
            self.ending = end(self.started, self.marker[MARKER], last_lines or {})
        return self.ending

    def end_leftovers(self) -> None:
        """After the launchers exited (or this process failed): end what they left, saying so when it took
        SIGKILL (a rank in a session of its own that torchrun could not end)."""
        if self.ending is not None:
            return
        ending = self.end()
        if ending.killed or ending.others_killed or ending.left:
            print(f"processes of the launch were left running: {ending}", file=sys.stderr)
