"""How much of the machine other processes used while a measurement ran: the notebooks' timing run
(``benchmarks/notebook_times.py``) says whether each time was taken on a busy machine.

    watch = OtherWork()
    ...                      # the measured work, in this process and the children it waits for
    watch.cores()            # other processes' CPU use meanwhile, in cores (1.0: one core busy throughout)

All CPU time the kernel counts (``/proc/stat``, Linux) minus this process's own and that of its children
that have ended and been waited for: a notebook's kernel, its torchrun ranks and their loader workers all
count as the measured work once the kernel has shut down. Elsewhere the answer is ``None``: unknown.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def _all_busy_seconds() -> float | None:
    """CPU seconds the machine has run any process since boot: user, nice, system, irq and softirq (idle,
    I/O wait and time stolen by a hypervisor left out)."""
    try:
        fields = PROC_STAT.read_text().splitlines()[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(value) for value in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU seconds of this process and of its ended children (theirs include their own ended children)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class OtherWork:
    """Started at construction; :meth:`cores` reads the CPU that other processes used since."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._all = _all_busy_seconds()
        self._own = _own_seconds()

    def cpu_seconds(self) -> float | None:
        """CPU seconds other processes used since the start, or ``None`` where the machine's total is unknown."""
        total = _all_busy_seconds()
        if total is None or self._all is None:
            return None
        # The kernel's counters tick in whole jiffies: a small negative remainder is rounding, not work.
        return max(0.0, (total - self._all) - (_own_seconds() - self._own))

    def cores(self) -> float | None:
        """Other processes' CPU use since the start, in cores on average."""
        seconds = self.cpu_seconds()
        elapsed = time.monotonic() - self._started
        return None if seconds is None or elapsed <= 0 else seconds / elapsed
