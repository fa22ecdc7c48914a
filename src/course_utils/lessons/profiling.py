"""Notebook 03: what the learner's profile and the course's profiled run say about where the time goes,
the phase split's figure, and the check of the exercise on the profiler's schedule and ranges.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure
from torch import nn

from course_utils.observe.noise import Measurement, compare, spread_text
from course_utils.observe.profiling import PHASES
from course_utils.tooling.exercises import Check, fixed_batches, tiny_cnn


def range_durations(prof: torch.profiler.profile) -> dict[str, list[float]]:
    """Milliseconds of every recorded instance of each named range (``record_function``) of a profile, in
    the order they ran: one per recorded iteration for a range every iteration opens."""
    durations: dict[str, list[float]] = {}
    for event in prof.events():
        if event.is_user_annotation and event.device_type == torch.autograd.DeviceType.CPU:
            durations.setdefault(event.name, []).append(event.time_range.elapsed_us() / 1000)
    return durations


def phase_agreement(prof: torch.profiler.profile, phases: pd.DataFrame) -> str:
    """Markdown: the share of each phase in the learner's profile beside the course's profiled run (host
    clock), each read through the spread of that phase's share over the learner's recorded iterations."""
    durations = range_durations(prof)
    missing = [phase for phase in PHASES if phase not in durations]
    if missing:
        return f"- Your profile has no range named {', '.join(missing)}: name the phases as the cell above does."
    total = sum(sum(durations[phase]) for phase in PHASES)
    course = phases.set_index("phase")["host_share_percent"]
    course_total = course[list(PHASES)].sum()
    iterations = [sum(parts) for parts in zip(*(durations[phase] for phase in PHASES))]
    lines = []
    for phase in PHASES:
        mine = 100 * sum(durations[phase]) / total
        theirs = 100 * course[phase] / course_total
        shares = Measurement.of(100 * part / whole for part, whole in zip(durations[phase], iterations) if whole > 0)
        verdict = compare(shares, Measurement.once(theirs), words=("larger in yours", "smaller in yours"))
        lines.append(f"- `{phase}`: **{mine:.0f} %** in your profile, **{theirs:.0f} %** in the course's (its share "
                     f"in each of your iterations: {spread_text(shares)}): {verdict.sentence()}")
    lines.append("Shares are of the four phases together, on the host clock. Few iterations are recorded, so the "
                 "spread is wide: record more (`active` in the schedule) to narrow it.")
    return "\n".join(lines)


ProfileSteps = Callable[[nn.Module, torch.optim.Optimizer, Iterator, torch.device], torch.profiler.profile]


def _ranges(prof: torch.profiler.profile, name: str) -> list[tuple[int, int]]:
    return [(event.time_range.start, event.time_range.end) for event in prof.events()
            if event.is_user_annotation and event.device_type == torch.autograd.DeviceType.CPU and event.name == name]


def check_profile(profile_steps: ProfileSteps, range_name: str = "loss", iterations: int = 3) -> Check:
    """Exercise: run the learner's profiling function on a tiny CNN and say whether its profile recorded
    ``iterations`` iterations, each with a range named ``range_name`` inside its ``forward`` range."""
    model = tiny_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = profile_steps(model, optimizer, iter(fixed_batches(10)), torch.device("cpu"))
    durations = range_durations(prof)
    recorded = len(durations.get("forward", []))
    found = len(durations.get(range_name, []))
    text = (f"your profile recorded {recorded} iterations (asked: {iterations}) and {found} ranges named "
            f"`{range_name}`")
    if recorded != iterations:
        return Check(False, f"{text}. The schedule records `active` iterations after `wait + warmup`, and the loop "
                            "must run all of them: set `active` where both the schedule and the loop read it.")
    if found != iterations:
        return Check(False, f"{text}. Open `with record_function(\"{range_name}\"):` around the loss computation, "
                            "every iteration (the name exactly so).")
    forwards = _ranges(prof, "forward")
    outside = [r for r in _ranges(prof, range_name) if not any(f[0] <= r[0] and r[1] <= f[1] for f in forwards)]
    if outside:
        return Check(False, f"{text}, but {len(outside)} of them are not inside a `forward` range: open it within "
                            "the `with record_function(\"forward\"):` block, so that the trace nests it there.")
    return Check(True, f"{text}; `{range_name}` took {statistics.median(durations[range_name]):.2f} ms per "
                       f"iteration (median), inside `forward`'s {statistics.median(durations['forward']):.2f} ms.")


def phase_answer(phases: pd.DataFrame, device_type: str) -> str:
    """Markdown: where the profiled iterations spent their time on the host clock and, with a GPU, on the
    device clock; the verdict reads the host clock for waiting on data, which the device clock cannot see."""

    def shares(column: str) -> str:
        ordered = phases.sort_values(column, ascending=False)
        return ", ".join(f"**{row.phase}** {getattr(row, column):.0f} %" for row in ordered.itertuples())

    def largest(column: str) -> str:
        return phases.sort_values(column, ascending=False).iloc[0]["phase"]

    lines = [f"- Host clock (the training process's wall time in each range): {shares('host_share_percent')}."]
    on_device = device_type == "cuda" and phases["device_share_percent"].notna().any()
    if on_device:
        lines.append(f"- Device clock (kernel time in each range): {shares('device_share_percent')}. Waiting for "
                     "a batch launches no kernel, so this clock cannot show an input-bound run; the host clock can.")
    advice = {"data": "the input pipeline is the bottleneck: the training process waits for batches (notebook 04).",
              "forward": "compute dominates, as it should; notebook 05 makes it cheaper.",
              "backward": "compute dominates, as it should (backward costs about twice forward); notebook 05 makes it "
                          "cheaper.",
              "optimizer_step": "the optimizer is unusually expensive: a fused optimizer (notebook 05) helps."}
    if largest("host_share_percent") == "data" or not on_device:
        clock, top = "host", largest("host_share_percent")
    else:
        clock, top = "device", largest("device_share_percent")
    lines.append(f"- The largest phase on the {clock} clock is `{top}`: {advice.get(top, '')}")
    return "\n".join(lines)


def holistic_trace_analysis(trace_dir: str | Path, device_type: str) -> str:
    """HTA's temporal breakdown of a GPU trace, or why it was not run."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return ("HolisticTraceAnalysis is not installed: pip install traceinsight==0.6.1 (in the course's "
                "test extra: pip install -e '.[test]')")
    if device_type != "cuda":
        return "This trace has no GPU kernels (it was recorded on the CPU): HTA has nothing to analyse."
    try:
        analyzer = TraceAnalysis(trace_dir=str(trace_dir))
        return analyzer.get_temporal_breakdown(visualize=False).to_string()
    except Exception as error:  # HTA's own failure modes vary by release; report them, do not stop the notebook
        return f"HTA could not analyse {trace_dir}: {error}"


def phase_split(phases: pd.DataFrame) -> Figure:
    """Share of an iteration spent in data, forward, backward and optimizer step (from a trace): one bar per
    clock, the host's (waiting for data included) and, with a GPU, the device's (kernel time)."""
    clocks = [("host", "host_share_percent")]
    if phases["device_share_percent"].notna().any():
        clocks.append(("device", "device_share_percent"))
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.6 * len(clocks)))
    colors = dict(zip(phases["phase"], plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for position, (_, column) in enumerate(clocks):
        left = 0.0
        for row in phases.itertuples():
            share = getattr(row, column)
            ax.barh(position, share, left=left, color=colors[row.phase],
                    label=row.phase if position == 0 else None)
            ax.text(left + share / 2, position, f"{share:.0f} %", ha="center", va="center", fontsize=7)
            left += share
    ax.set(xlim=(0, 100), yticks=range(len(clocks)), yticklabels=[clock for clock, _ in clocks],
           xlabel="% of the profiled iterations", title="Where the time goes")
    ax.invert_yaxis()
    ax.legend(ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.5), frameon=False)
    fig.tight_layout()
    return fig
