"""Notebook 12: a rank killed mid-run under torchrun with restarts allowed, the job resuming from its last
checkpoint on its own, and the time the crash cost, read from the run's own records.

The last rank kills itself with SIGKILL once a given step is logged (``--crash-at-step``, as the kernel's
out-of-memory killer or a failed node would, at a step that is the same on every machine). torchrun then ends the
other ranks and starts them all again (``max_restarts``); with ``--resume auto`` they continue from the newest
checkpoint. The crash cost the steps trained after that checkpoint, done twice, and the restart itself.
:class:`StepWatcher` notes when each step's record first appears in ``metrics.jsonl`` (rank 0 writes one at every
log point), in the crashed run's file and in the file the resumed run replaces it with; :func:`time_lost` reads
the cost from those times.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_utils.experiments.runs import run_ranks
from course_utils.observe.metrics import read_records
from course_utils.parallel.launch import LaunchResult
from course_utils.run_folder import RunFolder

POLL_SECONDS = 0.02
RANKS = 2


class StepWatcher(threading.Thread):
    """Notes, in seconds of ``time.monotonic()``, when each step's record first appears in the run ``out``: in
    its first ``metrics.jsonl`` (``before``) and in any file that replaces it, as a resumed run's does
    (``after``, holding the records it kept from before too); it polls in the background until :meth:`stop`."""

    def __init__(self, out: str | Path) -> None:
        super().__init__(daemon=True)
        self.metrics = RunFolder(out).metrics
        self.before: dict[int, float] = {}
        self.after: dict[int, float] = {}
        self._first_file: int | None = None
        self._over = threading.Event()
        self.start()

    def _note_steps(self) -> None:
        try:
            file = self.metrics.stat().st_ino
            records = read_records(self.metrics)
        except (OSError, ValueError):  # not there yet, or replaced mid-read
            return
        self._first_file = file if self._first_file is None else self._first_file
        seen, now = (self.before if file == self._first_file else self.after), time.monotonic()
        for record in records:
            if record.get("kind") == "step":
                seen.setdefault(record["step"], now)

    def run(self) -> None:
        while not self._over.is_set():
            self._note_steps()
            self._over.wait(POLL_SECONDS)

    def stop(self) -> None:
        """Stop watching, after one last look."""
        self._over.set()
        self.join(timeout=10)
        self._note_steps()


@dataclass(frozen=True)
class TimeLost:
    """What a crash cost: the steps trained twice and the seconds from a step's first record to its second."""

    rank: int  # the rank that died
    crashed_at: int  # the step it died after
    resumed_from: int  # the checkpoint's step
    last_logged: int  # the last step logged before the crash
    restart_seconds: float  # from the crash (the record of ``last_logged``) to the resumed run's first new record
    redo_seconds: float  # from there to the record of ``last_logged`` again
    lost_seconds: float  # from the first record of ``last_logged`` to its second

    @property
    def lost_steps(self) -> int:
        return max(0, self.crashed_at - self.resumed_from)


def resumed_step(result: LaunchResult) -> int:
    """The step the restarted ranks resumed from, as rank 0 said it ("resuming from ...: step N, ...")."""
    for line in result.lines:
        if "resuming from" in line and ": step " in line:
            return int(line.split(": step ")[1].split(",")[0])
    raise ValueError("the run never said 'resuming from': it did not restart from a checkpoint (was --resume auto "
                     "given, and a checkpoint written before the crash?)")


def time_lost(watcher: StepWatcher, crashed_at: int, result: LaunchResult) -> TimeLost:
    """The crash's cost from the watched records: lost steps, seconds to restart and to redo them."""
    start = resumed_step(result)
    redone = [step for step in watcher.after if step > start]
    if not watcher.before or not redone:
        raise ValueError("the crashed run logged no step, or the resumed run none after its checkpoint: nothing "
                         "to measure (is --log-every 1?)")
    last = max(watcher.before)
    first_again = watcher.after[min(redone)]
    again = watcher.after.get(last, first_again) if last > start else first_again  # no step to redo: none lost
    return TimeLost(RANKS - 1, crashed_at, start, last, first_again - watcher.before[last], again - first_again,
                    again - watcher.before[last])


def crash_and_restart(out: Path, crash_at: int = 11, timeout_seconds: float = 300,
                      **options: Any) -> tuple[LaunchResult, TimeLost]:
    """Train ``options`` with DDP on two ranks under torchrun, one restart allowed and ``--resume auto``; the last
    rank dies once step ``crash_at`` is logged; the launch and what the crash cost. A rerun starts afresh (the
    folder ``out`` is emptied first) and everything ends within ``timeout_seconds``."""
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    watcher = StepWatcher(out)
    try:
        result = run_ranks(RANKS, out, resume="auto", crash_at_step=crash_at, timeout_seconds=timeout_seconds,
                           max_restarts=1, **options)
    finally:
        watcher.stop()
    return result, time_lost(watcher, crash_at, result)


def _seconds(value: float) -> str:
    """Seconds as read at the watcher's resolution (on a GPU a few steps take less than two looks)."""
    if value < 2 * POLL_SECONDS:
        return f"under **{2 * POLL_SECONDS:.2f} s**"
    return f"**{value:.2f} s**" if value < 1 else f"**{value:.1f} s**"


def answer(lost: TimeLost, result: LaunchResult) -> str:
    """Markdown: what the learner just saw, with the figures."""
    steps = (result.summary or {}).get("steps")
    restart = (f"{_seconds(lost.restart_seconds)} to restart (torchrun noticing, new processes, the process group, "
               "the checkpoint read)")
    cost = (f"- Lost: **{lost.lost_steps} steps** trained twice, and {_seconds(lost.lost_seconds)} from step "
            f"{lost.last_logged}'s first record to its second: {restart} and {_seconds(lost.redo_seconds)} to train "
            "the lost steps again." if lost.lost_steps else
            f"- Lost: no step (the crash came right after a checkpoint), and {restart}.")
    return "\n".join([
        f"- Rank {lost.rank} was killed after step **{lost.crashed_at}**; torchrun ended the other rank, "
        f"started both again, and they resumed from the checkpoint of step **{lost.resumed_from}** on their own"
        + (f", finishing all **{steps}** steps." if steps else "."),
        cost,
        "- Checkpointing more often loses fewer steps but writes more; the restart's cost is paid whatever the "
        "interval.",
    ])
