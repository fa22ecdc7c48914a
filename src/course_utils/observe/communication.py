"""How much of a training step is communication, and how much of it hides behind computation, read from a
run's profiler trace (notebooks 06 and 07; train with ``--trace DIR``).

DDP all-reduces each bucket of gradients as soon as the backward pass has filled it, while the
backward pass goes on with the next layers: the communication that overlaps computation costs no
time, only the rest (typically the last bucket, after the backward pass) is exposed. The trace
shows both. On GPUs the collectives are NCCL/RCCL kernels (``ncclDevKernel_AllReduce...``) on their
own stream, and computation is every other kernel; on CPUs they are gloo's ``gloo:all_reduce``
ranges on its worker threads, and computation is the innermost operators the training thread ran
(not the ranges around them: the backward pass's last one also holds the wait for the all-reduce).

DataParallel moves data differently, from one process in every step: :func:`dataparallel_phases` reads its
named phases (:class:`course_utils.parallel.wrappers.NamedDataParallel`) and the copies between GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from course_utils.observe.profiling import ITERATION_PREFIX, trace_events
from course_utils.parallel.wrappers import DATAPARALLEL_BACKWARD, DATAPARALLEL_PHASES

COMMUNICATION_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms")
HOST_CATEGORIES = ("user_annotation", "cpu_op")  # the host's ranges and operators (autograd's nodes too)


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


def spans(events: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """A trace's steps, and its communication and computation as merged (start, end) spans, in microseconds."""
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:  # a GPU trace: the device's own timeline
        communication = [e for e in kernels if _is_communication_kernel(e)]
        computation = [e for e in kernels if not _is_communication_kernel(e)]
    else:
        communication = [e for e in events if e["name"].startswith("gloo:")]
        computation = _innermost([e for e in events if e.get("cat") == "cpu_op"
                                  and not e["name"].startswith(COMMUNICATION_PREFIXES)])
    merged = {name: _union((e["ts"], e["ts"] + e["dur"]) for e in chosen)
              for name, chosen in (("communication", communication), ("computation", computation))}
    # Steps stay apart, also where one ends exactly as the next begins.
    return {"steps": sorted((e["ts"], e["ts"] + e["dur"]) for e in host_steps(events)), **merged}


def per_step(trace_file: Path) -> pd.DataFrame:
    """One row per recorded step: its time, its communication, and how much of that overlapped computation."""
    found = spans(trace_events(trace_file))
    rows = []
    for start, end in found["steps"]:
        talk = _intersection(found["communication"], [(start, end)])
        hidden = _length(_intersection(talk, found["computation"]))
        rows.append({"step_ms": (end - start) / 1000, "communication_ms": _length(talk) / 1000,
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
    for step in host_steps(events):
        start, end = step["ts"], step["ts"] + step["dur"]
        inside = [e for e in events if start <= e["ts"] < end]
        row = {"step_ms": step["dur"] / 1000, **{f"{phase}_ms": 0.0 for phase in phases}}
        for event in inside:  # the host's ranges and autograd nodes, not their device-side copies
            if event.get("cat") in HOST_CATEGORIES and (phase := _phase_of(event["name"])) is not None:
                row[f"{phase}_ms"] += event["dur"] / 1000
        row["gpu_copies_ms"] = _length(_union((e["ts"], e["ts"] + e["dur"]) for e in inside
                                              if e.get("cat") == "gpu_memcpy" or _is_communication_kernel(e))) / 1000
        rows.append(row)
    return pd.DataFrame(rows)
