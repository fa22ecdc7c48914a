"""Stopping cleanly when the scheduler or a person asks: SIGTERM, SIGUSR1 or a first Ctrl-C means
"checkpoint and leave" (notebooks 07-08: the interrupted run, and Slurm jobs that requeue themselves).

Slurm sends SIGTERM before it kills a job (at its time limit, on ``scancel``, on preemption) and,
with ``#SBATCH --signal=USR1@120``, SIGUSR1 a chosen time before the end. The training loop then
finishes its step, writes a checkpoint, leaves ``PREEMPTED`` in the run folder and exits with
:data:`EXIT_CODE`; the job scripts see either and requeue themselves, and the requeued job
continues with ``--resume auto``. Ctrl-C in a terminal (SIGINT; in Jupyter, "interrupt the kernel")
does the same, and a second Ctrl-C stops at once, without a checkpoint.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

from course_utils.atomic_files import write_text_atomic
from course_utils.run_folder import RunFolder

EXIT_CODE = 99  # "checkpointed after a stop signal: resume me"
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
_last_received: str | None = None  # by the latest StopSignals of this process


def received_while_training() -> str | None:
    """The stop signal this process's latest training loop recorded, if any. A rank that fails after torchrun sent
    it SIGTERM (another rank died) does not wait for the others to report: torchrun is ending them already."""
    return _last_received


class Preempted(Exception):
    """The run stopped on a signal after writing its checkpoint."""


class StopSignals:
    """Records SIGTERM, SIGUSR1 and a first SIGINT instead of dying, while the training loop runs (main
    thread only); ``announce`` prints what a Ctrl-C will do (one rank is enough)."""

    def __init__(self, announce: bool = True) -> None:
        self.received: str | None = None
        self.announce = announce
        self._previous: dict[int, object] = {}

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if number == signal.SIGINT and self.received == "SIGINT":
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        global _last_received
        self.received = _last_received = signal.Signals(number).name
        if number == signal.SIGINT and self.announce:
            print("Ctrl-C: stopping after this step, with a checkpoint; press Ctrl-C again to stop at once "
                  "without one", file=sys.stderr, flush=True)

    def __enter__(self) -> StopSignals:
        global _last_received
        _last_received = None
        if threading.current_thread() is threading.main_thread():
            for number in SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def mark(folder: RunFolder, step: int, signal_name: str) -> None:
    """Leave the marker the job scripts look for (a launcher such as torchrun hides the exit code)."""
    write_text_atomic(folder.preempted, f"stopped by {signal_name} after step {step}; resume with --resume auto\n")


def clear(folder: RunFolder) -> None:
    folder.preempted.unlink(missing_ok=True)
