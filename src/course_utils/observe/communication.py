"""How much of a training step is communication, and how much of it hides behind computation, read from a
run's profiler trace (notebooks 06 and 07; train with ``--trace DIR``).

DDP all-reduces each bucket of gradients as soon as the backward pass has filled it, while the
backward pass goes on with the next layers: the communication that overlaps computation costs no
time, only the rest (typically the last bucket, after the backward pass) is exposed. The trace
shows both. On GPUs the collectives are NCCL/RCCL kernels (``ncclDevKernel_AllReduce...``) on their
own stream, and computation is every other kernel; on CPUs they are gloo's ``gloo:all_reduce``
ranges on its worker threads, and computation is the innermost operators the training thread ran
(not the ranges around them: the backward pass's last one also holds the wait for the all-reduce).

The device runs behind the host (the loop synchronizes only at its log points), so a step's kernels often
run after the host's range for that step has ended: each kernel, copy and memset belongs to the step whose
host code launched it, found through the launch's ``correlation`` id (the same id on the runtime call and on
the device's event). Cut by the host's windows instead, a step's all-reduce lands in the next step and the
last step's kernels in none. HolisticTraceAnalysis reads the same overlap from GPU traces
(``get_comm_comp_overlap``); the tests check the two agree on real traces.

How many bytes the collectives moved in each step (notebook 11) is read from the profiler's records of their
calls: PyTorch's ``record_param_comms`` operator with its element count and type, where the trace has it
(NCCL/RCCL runs of recent versions), else the ``gloo:``/``nccl:`` ranges with their input tensor's shape.

DataParallel moves data differently, from one process in every step: :func:`dataparallel_phases` reads its
named phases (:class:`course_utils.parallel.wrappers.NamedDataParallel`) and the copies between GPUs.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from course_utils.observe.profiling import ITERATION_PREFIX, trace_events
from course_utils.parallel.wrappers import DATAPARALLEL_BACKWARD, DATAPARALLEL_PHASES

COMMUNICATION_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms")
HOST_CATEGORIES = ("user_annotation", "cpu_op")  # the host's ranges and operators (autograd's nodes too)
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")  # the device's own work
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # the host's launches (ROCm's traces name HIP's calls so too)


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of the (merged) spans ``a`` that also lie in the (merged) spans ``b``."""
    found, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            found.append((max(start, b[k][0]), min(end, b[k][1])))
            k += 1
    return found


def _innermost(events: list[dict]) -> list[dict]:
    """The events that contain no other event of their thread: the work itself, not what waits around it."""
    leaves = []
    for thread in {e["tid"] for e in events}:
        ordered = sorted((e for e in events if e["tid"] == thread), key=lambda e: (e["ts"], -e["dur"]))
        for event, following in zip(ordered, ordered[1:] + [None]):
            if following is None or following["ts"] >= event["ts"] + event["dur"]:
                leaves.append(event)
    return leaves


def _is_communication_kernel(event: dict) -> bool:
    return event.get("cat") == "kernel" and "nccl" in event["name"].lower()


def host_steps(events: list[dict]) -> list[dict]:
    """The profiler's step ranges on the host. A GPU trace repeats each on the device's stream
    (``gpu_user_annotation``), late by however far the host ran ahead: those would merge neighbouring steps."""
    return [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(ITERATION_PREFIX)]


def _correlation(event: dict) -> int | None:
    return (event.get("args") or {}).get("correlation")


def device_work_by_step(events: list[dict], steps: list[dict]) -> list[list[dict]]:
    """The device's kernels, copies and memsets of each host step (``steps`` in time order): those the step's
    host code launched (the launch that shares the event's correlation id lies in the step's range). Work launched
    before the record began (its launch is not in the trace) belongs to none; in a trace without launches or
    correlation ids, work falls to the step whose range holds its start."""
    starts = [step["ts"] for step in steps]

    def step_at(ts: float) -> int | None:
        index = bisect_right(starts, ts) - 1
        return index if index >= 0 and ts < steps[index]["ts"] + steps[index]["dur"] else None

    launched = {_correlation(e): step_at(e["ts"]) for e in events
                if e.get("cat") in LAUNCH_CATEGORIES and _correlation(e) is not None}
    found: list[list[dict]] = [[] for _ in steps]
    for event in events:
        if event.get("cat") in DEVICE_CATEGORIES:
            correlation = _correlation(event)
            # A launch missing from a trace that holds launches came before the record began: the work belongs
            # to no recorded step
            index = step_at(event["ts"]) if correlation is None or not launched else launched.get(correlation)
            if index is not None:
                found[index].append(event)
    return found


# Bytes per element of the type names that the collectives' records carry: record_param_comms's ``dtype``
# (c10's ScalarType names) and the ranges' ``Input type`` (C++ type names).
ELEMENT_BYTES = {"Float": 4, "Double": 8, "BFloat16": 2, "Half": 2, "Long": 8, "Int": 4, "Short": 2, "Byte": 1,
                 "Char": 1, "Bool": 1, "float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2,
                 "long int": 8, "int": 4, "short int": 2, "unsigned char": 1, "signed char": 1, "bool": 1}
NOT_MOVING_DATA = ("wait", "barrier", "init", "")  # record_param_comms also records these


def _call_bytes(events: list[dict]) -> list[tuple[float, int]]:
    """(start, bytes) of every collective call the host recorded."""
    counted = [(e["ts"], e["args"]["In msg nelems"] * ELEMENT_BYTES.get(str(e["args"].get("dtype")), 4))
               for e in events if e["name"] == "record_param_comms" and "In msg nelems" in e.get("args", {})
               and e["args"].get("Collective name", "") not in NOT_MOVING_DATA]
    if counted:
        return counted
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(("gloo:", "nccl:"))
              and e.get("args", {}).get("Input Dims")]
    return [(e["ts"], math.prod(e["args"]["Input Dims"][0]) * ELEMENT_BYTES.get(e["args"]["Input type"][0], 4))
            for e in ranges]


def collective_bytes(trace_file: Path) -> list[int]:
    """Bytes handed to the collectives in each traced step of the run (rank 0's trace): every call's input
    tensor, its elements times its element's size."""
    events = trace_events(trace_file)
    calls = _call_bytes(events)
    totals = []
    for step in host_steps(events):
        start, end = step["ts"], step["ts"] + step["dur"]
        totals.append(sum(size for ts, size in calls if start <= ts < end))
    return totals


def _merged(events: Iterable[dict]) -> list[tuple[float, float]]:
    return _union((e["ts"], e["ts"] + e["dur"]) for e in events)


def per_step(trace_file: Path) -> pd.DataFrame:
    """One row per recorded step: its time, its communication, and how much of that overlapped computation.
    On a GPU, a step's communication is the NCCL/RCCL kernels its host code launched, wherever they ran;
    hidden is what of it ran beside a computation kernel of the recorded steps."""
    events = trace_events(trace_file)
    steps = sorted(host_steps(events), key=lambda step: step["ts"])
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:  # a GPU trace: the device's own timeline
        work = device_work_by_step(events, steps)
        computation = _merged(e for found in work for e in found
                              if e.get("cat") == "kernel" and not _is_communication_kernel(e))
        talks = [_merged(e for e in found if _is_communication_kernel(e)) for found in work]
    else:  # gloo: its ranges run on the host's threads, inside the step that called them
        communication = _merged(e for e in events if e["name"].startswith("gloo:"))
        computation = _union((e["ts"], e["ts"] + e["dur"]) for e in _innermost(
            [e for e in events if e.get("cat") == "cpu_op" and not e["name"].startswith(COMMUNICATION_PREFIXES)]))
        talks = [_intersection(communication, [(step["ts"], step["ts"] + step["dur"])]) for step in steps]
    rows = []
    for step, talk in zip(steps, talks):
        hidden = _length(_intersection(talk, computation))
        rows.append({"step_ms": step["dur"] / 1000, "communication_ms": _length(talk) / 1000,
                     "hidden_ms": hidden / 1000, "exposed_ms": (_length(talk) - hidden) / 1000})
    table = pd.DataFrame(rows)
    if not table.empty:
        table["communication_percent"] = 100 * table["communication_ms"] / table["step_ms"]
        table["exposed_percent"] = 100 * table["exposed_ms"] / table["step_ms"]
    return table


def _phase_of(name: str) -> str | None:
    if name.startswith("DataParallel.") and name.split(".", 1)[1] in DATAPARALLEL_PHASES:
        return name.split(".", 1)[1]
    node = name.rsplit(": ", 1)[-1]  # "autograd::engine::evaluate_function: BroadcastBackward"
    return DATAPARALLEL_BACKWARD.get(node) if name.startswith("autograd::engine::") else None


def dataparallel_phases(trace_file: Path) -> pd.DataFrame:
    """One row per recorded step of a DataParallel run: its time, the host's time in each of DataParallel's
    phases (forward: scatter, replicate, parallel_apply, gather; backward: gradients reduced into GPU 0,
    output gradients scattered), and the time the GPUs spent moving data: copies between devices and host,
    and the NCCL kernels by which replicate broadcasts the weights and the backward sums the gradients."""
    events = trace_events(trace_file)
    phases = [*DATAPARALLEL_PHASES, *DATAPARALLEL_BACKWARD.values()]
    rows = []
    steps = sorted(host_steps(events), key=lambda step: step["ts"])
    for step, work in zip(steps, device_work_by_step(events, steps)):
        start, end = step["ts"], step["ts"] + step["dur"]
        row = {"step_ms": step["dur"] / 1000, **{f"{phase}_ms": 0.0 for phase in phases}}
        for event in events:  # the host's ranges and autograd nodes, not their device-side copies
            if (start <= event["ts"] < end and event.get("cat") in HOST_CATEGORIES
                    and (phase := _phase_of(event["name"])) is not None):
                row[f"{phase}_ms"] += event["dur"] / 1000
        row["gpu_copies_ms"] = _length(_merged(e for e in work if e.get("cat") == "gpu_memcpy"
                                               or _is_communication_kernel(e))) / 1000
        rows.append(row)
    return pd.DataFrame(rows)


def overlap_by_hta(trace_dir: Path) -> pd.DataFrame:
    """HolisticTraceAnalysis's share of each rank's communication time that overlapped computation, for the
    GPU traces in ``trace_dir`` (one per rank, plain or gzipped), over all recorded steps as :func:`per_step`
    counts them: ``rank`` and ``overlap_percent``. HTA reads time in whole microseconds, so on traces with
    nanosecond times the two differ by a fraction of a percent."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as error:
        raise ImportError("HolisticTraceAnalysis is not installed: pip install traceinsight==0.6.1 "
                          "(in the course's test extra: pip install -e '.[test]')") from error
    analysis = TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=True)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    return overlap.rename(columns={"comp_comm_overlap_pctg": "overlap_percent"})[["rank", "overlap_percent"]]
