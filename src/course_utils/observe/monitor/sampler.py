"""A background thread that samples the devices every ``interval`` seconds, with phase labels (notebook 02,
its sweeps, and any run with ``--monitor``).

    with Monitor(interval=0.5) as monitor:
        monitor.phase("epoch 1")
        ...
    monitor.frame()   # one row per device and sample

Sampling costs one library call (NVML, AMD SMI) or one tool start (nvidia-smi, rocm-smi) per
interval in a thread that sleeps in between; ``benchmarks/monitor_cost.py`` measures what
that costs a training run.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch

from course_utils import devices
from course_utils.observe.monitor.backends import open_backend

# pandas only where a table is made: the training command's ranks import this module, and pandas would cost
# each of them 0.7 s of CPU at start-up for tables a run never makes.
if TYPE_CHECKING:
    import pandas as pd


class Monitor:
    """Samples readings in a daemon thread from :meth:`start` to :meth:`stop`."""

    def __init__(self, backend: str = "auto", interval: float = 0.5, device: torch.device | None = None) -> None:
        """``device``: the one this process uses (default: its current GPU, else the CPU); its rows are
        marked ``this_process``, matched by PCI address, since tool indices need not be the runtime's.
        ``auto`` for a process on the CPU samples the CPU, not the idle GPUs of its machine."""
        if interval <= 0:
            raise ValueError("the sampling interval must be positive")
        device = device or devices.default_device()
        # Fails here, in the caller, if the backend is absent.
        self.backend = open_backend("cpu" if backend == "auto" and device.type == "cpu" else backend)
        self.interval = interval
        self.pci_address = devices.pci_address(device)
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._phase = "start"
        self._start = time.perf_counter()
        self.failure: str | None = None  # why sampling stopped early, if it did

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def phase(self, name: str) -> None:
        """Label the samples taken from now on (e.g. "warm-up", "epoch 2", "eval")."""
        self._phase = name

    def sample(self) -> list[dict[str, Any]]:
        """Take one sample now, store it and return its rows."""
        seconds = time.perf_counter() - self._start
        rows = [{"seconds": seconds, "phase": self._phase, **reading.as_dict(),
                 "this_process": bool(self.pci_address) and reading.pci_address == self.pci_address}
                for reading in self.backend.read()]
        with self._lock:
            self._rows.extend(rows)
        return rows

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                self.sample()
            except Exception as error:  # a monitor that fails must never cost the run it watches
                self.failure = f"{self.backend.name} stopped after {started - self._start:.0f} s: {error}"
                warnings.warn(f"monitor: {self.failure}; the run goes on without further samples",
                              RuntimeWarning, stacklevel=1)
                return
            self._stop.wait(max(0.0, self.interval - (time.perf_counter() - started)))

    def start(self) -> Monitor:
        if self._thread is not None:
            raise RuntimeError("this monitor is already running")
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="course-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, wait for the thread to end and release the backend."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 3 * self.interval))
        self._thread = None
        self.backend.close()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def frame(self) -> pd.DataFrame:
        """All samples so far, one row per device and sample."""
        import pandas as pd

        with self._lock:
            return pd.DataFrame(self._rows)


def this_process_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The samples of the device this process uses; where no address matched (the CPU, a tool that
    prints none), those of the lowest index."""
    if frame.empty:
        return frame
    mine = frame[frame["this_process"]] if "this_process" in frame else frame.iloc[:0]
    return mine if not mine.empty else frame[frame["index"] == frame["index"].min()]


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Per device and phase: mean utilization, peak memory, mean power and its share of the limit."""
    if frame.empty:
        return frame
    grouped = frame.groupby(["index", "phase"], sort=False)
    table = grouped.agg(samples=("seconds", "size"), utilization_percent=("utilization_percent", "mean"),
                        memory_peak_mib=("memory_used_mib", "max"), memory_total_mib=("memory_total_mib", "max"),
                        power_watts=("power_watts", "mean"), power_limit_watts=("power_limit_watts", "max"))
    table["power_of_limit_percent"] = 100 * table["power_watts"] / table["power_limit_watts"]
    return table.reset_index()
