"""torch.profiler around the training loop, named ranges, and where the time went (notebook 03, and any
run with ``--trace``).

The training loop marks each iteration's phases as ``data``, ``forward``, ``backward`` and
``optimizer_step``. With a trace requested, each mark is a ``torch.profiler.record_function``
range (visible in the Chrome/Perfetto trace and the operator table) and, on a GPU, an NVTX range
for Nsight Systems; PyTorch's ROCm build sends the same calls to ROCTX for rocprofv3. Without a
trace the marks cost nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from course_utils.atomic_files import write_text_atomic
from course_utils.shared_folders import make_folder

# pandas only where a table is made: the training command's ranks import this module, and pandas would cost
# each of them 0.7 s of CPU at start-up for tables a run never makes.
if TYPE_CHECKING:
    import pandas as pd

PHASES = ("data", "forward", "backward", "optimizer_step")
TRACE_FILE = "trace.json"
ITERATION_PREFIX = "ProfilerStep#"  # the profiler's range around each step, "ProfilerStep#12"


def trace_events(trace_file: Path) -> list[dict]:
    """The complete events (``"ph": "X"``, with a duration) of a Chrome trace the profiler wrote, plain or
    gzipped (``.pt.trace.json.gz``: what the TensorBoard handler writes with ``use_gzip=True``, and how most
    traces are shared)."""
    trace_file = Path(trace_file)
    if not trace_file.is_file():
        raise FileNotFoundError(f"no trace at {trace_file}: train with trace=DIR (--trace DIR) first")
    with (gzip.open if trace_file.suffix == ".gz" else open)(trace_file, "rb") as stream:
        trace = json.load(stream)
    return [event for event in trace["traceEvents"] if event.get("ph") == "X" and "dur" in event]


DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # the device's own events in a trace
LAUNCHES = ("cuda_runtime", "cuda_driver")  # the host's calls that start them (HIP's too, in a ROCm trace)


def device_ms_by_phase(events: list[dict], phases: tuple[str, ...] = PHASES) -> dict[str, float]:
    """The device's time in each phase, each kernel (copy, fill) counted in the phase whose range on the host was
    open when the host launched it, on whichever thread: on a GPU the backward pass launches its kernels from
    autograd's own thread, outside the event tree of the main thread's ``backward`` range, where the profiler's
    per-range device totals would give it none. A kernel and its launch share a ``correlation`` id."""
    windows = sorted((e["pid"], float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]) for e in events
                     if e.get("cat") == "user_annotation" and e.get("name") in phases)
    starts = [(pid, start) for pid, start, _, _ in windows]
    launched = {e["args"]["correlation"]: (e["pid"], float(e["ts"])) for e in events
                if e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})}
    totals = dict.fromkeys(phases, 0.0)
    for event in events:
        launch = launched.get(event.get("args", {}).get("correlation")) if event.get("cat") in DEVICE_WORK else None
        if launch is None:
            continue
        index = bisect.bisect_right(starts, launch) - 1  # the last range of that process opened before the launch
        if index >= 0 and windows[index][0] == launch[0] and launch[1] <= windows[index][2]:
            totals[windows[index][3]] += float(event["dur"]) / 1000
    return totals


OPERATORS_FILE = "operators.csv"
PHASES_FILE = "phases.csv"


class Ranges:
    """Named ranges for the phases of an iteration; free when ``enabled`` is False."""

    def __init__(self, enabled: bool = False, nvtx: bool = False) -> None:
        self.enabled = enabled
        self.nvtx = nvtx and torch.cuda.is_available()

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            with record_function(name):
                yield
        finally:
            if self.nvtx:
                torch.cuda.nvtx.range_pop()


NO_RANGES = Ranges(enabled=False)


@dataclass(frozen=True)
class TraceSchedule:
    """Which iterations the profiler records: skip ``wait``, warm up for ``warmup``, record ``active``."""

    wait: int = 5
    warmup: int = 2
    active: int = 5

    def fitted(self, total_steps: int) -> TraceSchedule:
        """The same schedule shrunk so that its active steps happen within ``total_steps``."""
        active = max(1, min(self.active, total_steps))
        warmup = max(0, min(self.warmup, total_steps - active))
        wait = max(0, min(self.wait, total_steps - active - warmup))
        return TraceSchedule(wait, warmup, active)


def start_trace(out_dir: Path, plan: TraceSchedule, device: torch.device) -> profile:
    """A started profiler that writes, when its active steps are done, ``out_dir/trace.json``
    (Chrome/Perfetto format), a TensorBoard-plugin trace under ``out_dir/tensorboard``, and the
    operator and phase tables as ``operators.csv`` and ``phases.csv``.

    Call ``.step()`` after every iteration and ``.stop()`` at the end.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensorboard_dir = out_dir / "tensorboard"

    def on_trace_ready(prof: profile) -> None:
        # Exported into a folder of this process's own, then moved into place: the export would follow a link
        # planted under the trace's name in a shared folder, a rename replaces it.
        private = Path(tempfile.mkdtemp(prefix=".trace-", dir=out_dir))
        try:
            prof.export_chrome_trace(str(private / TRACE_FILE))  # a trace can be exported only once ...
            plugin_name = f"{socket.gethostname()}_{os.getpid()}.{time.time_ns() // 1_000_000}.pt.trace.json"
            shutil.copyfile(private / TRACE_FILE, private / plugin_name)  # ... so the TensorBoard plugin gets a copy
            os.replace(private / plugin_name, make_folder(tensorboard_dir) / plugin_name)
            os.replace(private / TRACE_FILE, out_dir / TRACE_FILE)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        write_text_atomic(out_dir / OPERATORS_FILE, top_operators(prof, count=50).to_csv(index=False))
        write_text_atomic(out_dir / PHASES_FILE, phase_split(prof, out_dir / TRACE_FILE).to_csv(index=False))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities,
                   schedule=schedule(wait=plan.wait, warmup=plan.warmup, active=plan.active, repeat=1),
                   on_trace_ready=on_trace_ready, record_shapes=True, profile_memory=False)
    prof.start()
    return prof


def host_events(prof: profile) -> list:
    """The profiler's averages of what the host ran: operators and ranges, each with the device time of the
    kernels it launched. A GPU trace also lists the kernels themselves and a device-side copy of every range
    (``gpu_user_annotation``, no host time), under the same names: left out."""
    return [e for e in prof.key_averages() if e.device_type == DeviceType.CPU]


def top_operators(prof: profile, count: int = 15) -> pd.DataFrame:
    """The operators that took the most time (self time, on the device where there is one)."""
    import pandas as pd

    rows = [
        {"operator": e.key, "calls": e.count, "cpu_self_ms": e.self_cpu_time_total / 1000,
         "cpu_total_ms": e.cpu_time_total / 1000,
         "device_self_ms": getattr(e, "self_device_time_total", 0.0) / 1000}
        for e in host_events(prof) if e.key not in PHASES and not e.key.startswith("ProfilerStep")
    ]
    table = pd.DataFrame(rows)
    order = "device_self_ms" if table["device_self_ms"].sum() > 0 else "cpu_self_ms"
    return table.sort_values(order, ascending=False).head(count).reset_index(drop=True)


def phase_split(prof: profile, trace_file: Path) -> pd.DataFrame:
    """Time in each phase range over the recorded iterations, on both clocks, and each one's share.

    The host clock (``cpu_ms``) is the wall time the training process spent in the range, waiting
    for the next batch included; the device clock (``device_ms``) is kernel time, read from the profile's
    exported ``trace_file`` (:func:`device_ms_by_phase`). Waiting for data launches no kernel, so only the host
    clock shows an input-bound run, on a GPU as on a CPU; the device clock shows where the GPU's own work goes.
    """
    import pandas as pd

    events = {e.key: e for e in host_events(prof) if e.key in PHASES}
    device_ms = device_ms_by_phase(trace_events(trace_file))
    rows = [{"phase": name, "calls": events[name].count, "cpu_ms": events[name].cpu_time_total / 1000,
             "device_ms": device_ms[name]} for name in PHASES if name in events]
    table = pd.DataFrame(rows)
    if not table.empty:
        table["host_share_percent"] = 100 * table["cpu_ms"] / table["cpu_ms"].sum()
        device_total = table["device_ms"].sum()
        table["device_share_percent"] = 100 * table["device_ms"] / device_total if device_total > 0 else float("nan")
    return table


def read_tables(out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The operator and phase tables a traced run wrote to ``out_dir``."""
    import pandas as pd

    out_dir = Path(out_dir)
    if not (out_dir / PHASES_FILE).exists():
        raise FileNotFoundError(f"{out_dir} holds no trace tables: train with --trace {out_dir} first")
    return pd.read_csv(out_dir / OPERATORS_FILE), pd.read_csv(out_dir / PHASES_FILE)
