"""The recorded trace as a timeline in the notebook (notebook 03): the profiled iterations and the course's
phases within them, one row per host thread and per device stream, read from ``trace.json``.

Perfetto shows every event of the trace, but needs its web page; this draws the part a lesson needs wherever
the notebook runs, in seconds also for a real multi-GPU trace of tens of thousands of kernels (each row's
spans of one colour are drawn by one call). The file is the Chrome trace format that ``torch.profiler`` exports
(plain or gzipped): complete events
(``"ph": "X"``) with a start ``ts`` and a duration ``dur`` in microseconds; ``user_annotation`` events are
the ``record_function`` ranges on a host thread, ``gpu_user_annotation`` the same ranges on a device stream,
and ``kernel`` the device's kernels.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_utils.observe.profiling import ITERATION_PREFIX, PHASES, trace_events

PHASE_COLORS = dict(zip(PHASES, ("#dd8452", "#4c72b0", "#c44e52", "#55a868")))
LABEL_FONT_POINTS = 7.5
CHARACTER_WIDTH = 0.62  # of the font size: a generous mean width of a character, so that a label that fits, fits


def read_spans(trace_file: Path) -> pd.DataFrame:
    """The iterations, the phases and the device's kernels of a trace: one row per span, with its ``row`` (where
    it runs), ``kind`` (iteration, phase or kernel), ``name``, and ``start_ms``/``end_ms`` from the first
    recorded iteration's start."""
    rows = []
    for event in trace_events(trace_file):
        name, category = event.get("name", ""), event.get("cat", "")
        if category == "user_annotation" and name.startswith(ITERATION_PREFIX):
            kind, row = "iteration", f"host thread {event['tid']}: iterations"
        elif category == "user_annotation" and name in PHASES:
            kind, row = "phase", f"host thread {event['tid']}: phases"
        elif category == "gpu_user_annotation" and name in PHASES:
            kind, row = "phase", f"device {event['pid']} stream {event['tid']}: phases"
        elif category == "kernel":
            kind, row = "kernel", f"device {event['pid']} stream {event['tid']}: kernels"
        else:
            continue
        rows.append({"row": row, "kind": kind, "name": name, "start_us": float(event["ts"]),
                     "duration_us": float(event["dur"])})
    spans = pd.DataFrame(rows, columns=["row", "kind", "name", "start_us", "duration_us"])
    iterations = spans[spans["kind"] == "iteration"]
    if iterations.empty:
        raise ValueError(f"{trace_file} holds no {ITERATION_PREFIX}N spans: is it a torch.profiler trace with a "
                         f"schedule (prof.step() after every iteration)?")
    origin = iterations["start_us"].min()
    spans["start_ms"] = (spans["start_us"] - origin) / 1000
    spans["end_ms"] = spans["start_ms"] + spans["duration_us"] / 1000
    return spans.drop(columns=["start_us", "duration_us"]).sort_values(["row", "start_ms"]).reset_index(drop=True)


def _fits(label: str, span_ms: float, axis_ms: float, axis_points: float) -> bool:
    """Whether ``label`` fits inside a span of ``span_ms`` on an axis ``axis_ms`` long and ``axis_points`` wide:
    spans on one row do not overlap, so labels kept inside their spans do not overlap either."""
    return span_ms / axis_ms * axis_points >= len(label) * LABEL_FONT_POINTS * CHARACTER_WIDTH + 4


def draw(trace_file: Path, title: str = "") -> Figure:
    """The timeline of the recorded iterations: ``ProfilerStep#N`` spans and the phases within them on each host
    thread, and on a GPU the same phases and the kernels on each device stream. A label is written only where
    it fits inside its span; the legend names the phases' colours."""
    spans = read_spans(trace_file)
    rows = sorted(spans["row"].unique(), key=lambda row: (row.startswith("device"), row))  # host rows first
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.6 * len(rows)))
    axis_ms = spans["end_ms"].max() - min(0.0, spans["start_ms"].min())
    axis_points = fig.get_figwidth() * 72 * 0.75  # the axes' share of the figure's width, after the row names
    for position, row in enumerate(rows):
        y = len(rows) - 1 - position
        on_row = spans[spans["row"] == row]
        colors = [PHASE_COLORS.get(name, "0.75" if kind == "iteration" else "0.35")
                  for name, kind in zip(on_row["name"], on_row["kind"])]
        # One call per colour of a row: a real GPU trace holds tens of thousands of kernels.
        for (color, is_kernel), group in on_row.groupby([colors, on_row["kind"].eq("kernel")], sort=False):
            ax.broken_barh(list(zip(group["start_ms"], group["end_ms"] - group["start_ms"])), (y - 0.35, 0.7),
                           facecolors=color, edgecolors="none" if is_kernel else "white", linewidth=0.5)
        for span in on_row[on_row["kind"] != "kernel"].itertuples():
            label = f"#{span.name.removeprefix(ITERATION_PREFIX)}" if span.kind == "iteration" else span.name
            if _fits(label, span.end_ms - span.start_ms, axis_ms, axis_points):
                ax.text((span.start_ms + span.end_ms) / 2, y, label, ha="center", va="center",
                        fontsize=LABEL_FONT_POINTS, clip_on=True)
    ax.set_yticks(range(len(rows)), list(reversed(rows)), fontsize=8)
    ax.set(xlabel="milliseconds since the first recorded iteration began", ylim=(-0.6, len(rows) - 0.4))
    ax.set_title(title or f"The recorded iterations: {spans['kind'].eq('iteration').sum()} steps", loc="left",
                 fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for color in PHASE_COLORS.values()]
    ax.legend(handles, PHASE_COLORS, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(PHASE_COLORS),
              fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
