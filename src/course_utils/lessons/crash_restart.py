"""Notebook 12: a rank killed mid-run under torchrun with restarts allowed, the job resuming from its last
checkpoint on its own, and the time the crash cost, read from the run's own records.

:class:`RankKiller` watches the run's ``metrics.jsonl`` (rank 0 writes a record at every log point) and notes when
each step's record first appears; once the run has logged a given step it kills one rank's process with SIGKILL,
as the kernel's out-of-memory killer or a failed node would. torchrun then ends the other ranks and starts them
all again (``max_restarts``); with ``--resume auto`` they continue from the newest checkpoint. The crash cost the
steps trained after that checkpoint, done twice, and the restart itself: :func:`time_lost` reads both from the
watched records, as the time between a step's first record and its record again after the restart.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from course_utils.lessons.data_parallel import RANK_THREADS, SCRATCH
from course_utils.observe.metrics import read_records
from course_utils.parallel.launch import LaunchResult, launch
from course_utils.run_folder import RunFolder
from course_utils.training.options import to_flags

POLL_SECONDS = 0.05


def rank_process(rank: int, marker: str) -> psutil.Process | None:
    """The training process of ``rank`` among the launch whose arguments contain ``marker`` (its --out)."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            command = " ".join(process.info["cmdline"] or [])
            if marker in command and "course_utils.train" in command and process.environ().get("RANK") == str(rank):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


class RankKiller(threading.Thread):
    """Kills ``rank`` with SIGKILL once the run in ``out`` has logged ``step`` or a later one, polling in the
    background for at most ``timeout`` seconds; meanwhile it notes when each logged step first appeared, before
    the kill (``before``) and after it (``after``), in seconds of ``time.monotonic()``."""

    def __init__(self, rank: int, out: str | Path, step: int, timeout: float = 240.0) -> None:
        super().__init__(daemon=True)
        self.rank, self.step, self.metrics, self.marker = rank, step, RunFolder(out).metrics, str(out)
        self.deadline = time.monotonic() + timeout
        self.killed_at: float | None = None
        self.killed_after: int | None = None  # the last step logged before the kill
        self.before: dict[int, float] = {}
        self.after: dict[int, float] = {}  # the resumed run's, and the records it kept from before (up to its step)
        self._file_at_kill: int | None = None
        self._over = threading.Event()
        self.start()

    @property
    def killed(self) -> bool:
        return self.killed_at is not None

    def _note_steps(self) -> None:
        try:
            file = self.metrics.stat().st_ino
            records = read_records(self.metrics)
        except (OSError, ValueError):  # not there yet, or replaced mid-read
            return
        if self.killed and file == self._file_at_kill:  # the crashed run's records: the resumed run replaces them
            return
        seen, now = (self.after if self.killed else self.before), time.monotonic()
        for record in records:
            if record.get("kind") == "step":
                seen.setdefault(record["step"], now)

    def run(self) -> None:
        process = None  # found before the step comes, so that the kill follows the record at once
        while not self._over.is_set() and time.monotonic() < self.deadline:
            self._note_steps()
            if not self.killed:
                if process is None or not process.is_running():
                    process = rank_process(self.rank, self.marker)
                if process is not None and self.before and max(self.before) >= self.step:
                    self._file_at_kill = self.metrics.stat().st_ino
                    process.kill()
                    self.killed_at, self.killed_after = time.monotonic(), max(self.before)
            self._over.wait(POLL_SECONDS)

    def stop(self) -> None:
        """Stop watching (at once, not at the deadline)."""
        self._over.set()
        self.join(timeout=10)

    def check(self) -> None:
        """Once the launch is over: stop watching, and fail unless the rank was killed as planned."""
        self.stop()
        assert self.killed, (f"rank {self.rank} was never killed: the run in {self.marker} never logged step "
                             f"{self.step} or a later one while its ranks ran")


@dataclass(frozen=True)
class TimeLost:
    """What a crash cost: the steps trained twice and the seconds from a step's first record to its second."""

    rank: int  # the rank killed
    resumed_from: int  # the checkpoint's step
    last_logged: int  # the last step logged before the crash
    restart_seconds: float  # from the kill to the resumed run's first record
    redo_seconds: float  # from there to the record of ``last_logged`` again
    lost_seconds: float  # from the first record of ``last_logged`` to its second

    @property
    def lost_steps(self) -> int:
        return max(0, self.last_logged - self.resumed_from)


def resumed_step(result: LaunchResult) -> int:
    """The step the restarted ranks resumed from, as rank 0 said it ("resuming from ...: step N, ...")."""
    for line in result.lines:
        if "resuming from" in line and ": step " in line:
            return int(line.split(": step ")[1].split(",")[0])
    raise ValueError("the run never said 'resuming from': it did not restart from a checkpoint (was --resume auto "
                     "given, and a checkpoint written before the crash?)")


def time_lost(killer: RankKiller, result: LaunchResult) -> TimeLost:
    """The crash's cost from the watched records: lost steps, seconds to restart and to redo them."""
    last, start = killer.killed_after, resumed_step(result)
    redone = [step for step in killer.after if step > start]
    if last is None or not redone:
        raise ValueError("the resumed run logged no step after its checkpoint: nothing to measure")
    first_again = killer.after[min(redone)]
    if last <= start:  # the crash came after a checkpoint was written, before the next record: no step lost
        return TimeLost(killer.rank, start, last, first_again - killer.killed_at, 0.0,
                        first_again - killer.before[last])
    return TimeLost(killer.rank, start, last, first_again - killer.killed_at, killer.after[last] - first_again,
                    killer.after[last] - killer.before[last])


def crash_and_restart(out: Path, rank: int = 1, kill_after: int = 11, timeout_seconds: float = 300,
                      **options: Any) -> tuple[LaunchResult, TimeLost]:
    """Train ``options`` with DDP on two ranks under torchrun, one restart allowed and ``--resume auto``; kill
    ``rank`` once step ``kill_after`` is logged; the launch and what the crash cost. A rerun starts afresh (the
    folder ``out`` is emptied first) and everything ends within ``timeout_seconds``."""
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    killer = RankKiller(rank, out, kill_after, timeout=timeout_seconds)
    flags = to_flags(**{**SCRATCH, **options}, distributed="ddp", resume="auto", out=out)
    try:
        result = launch(2, "course_utils.train", *flags, log_dir=out.parent / f"{out.name}-logs", echo=False,
                        timeout_seconds=timeout_seconds, max_restarts=1, env={"OMP_NUM_THREADS": str(RANK_THREADS)})
    finally:
        killer.stop()
    killer.check()
    if not result.ok:
        raise RuntimeError(f"the job did not finish after its restart (exit {result.returncode}):\n"
                           + "\n".join(result.lines[-20:]))
    return result, time_lost(killer, result)


def answer(lost: TimeLost, result: LaunchResult) -> str:
    """Markdown: what the learner just saw, with the figures."""
    steps = (result.summary or {}).get("steps")
    return "\n".join([
        f"- Rank {lost.rank} was killed after step **{lost.last_logged}** was logged; torchrun ended the other rank, "
        f"started both again, and they resumed from the checkpoint of step **{lost.resumed_from}** on their own"
        + (f", finishing all **{steps}** steps." if steps else "."),
        f"- Lost: **{lost.lost_steps} steps** trained twice, and **{lost.lost_seconds:.1f} s** from step "
        f"{lost.last_logged}'s first record to its second: **{lost.restart_seconds:.1f} s** to restart (torchrun "
        f"noticing, new processes, the process group, the checkpoint read) and **{lost.redo_seconds:.1f} s** to "
        "train the lost steps again.",
        "- Checkpointing more often loses fewer steps but writes more; the restart's cost is paid whatever the "
        "interval.",
    ])
