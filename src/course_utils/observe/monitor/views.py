"""Monitor samples as a timeline plot and as a live view in JupyterLab (notebook 02)."""

from __future__ import annotations

import threading

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_utils.notebook import interactive
from course_utils.observe.monitor.sampler import Monitor, this_process_rows


def _shade_phases(ax, frame: pd.DataFrame) -> None:
    mine = this_process_rows(frame)
    spans = mine.groupby((mine["phase"] != mine["phase"].shift()).cumsum())
    for number, (_, span) in enumerate(spans):
        if number % 2 == 1:
            ax.axvspan(span["seconds"].min(), span["seconds"].max(), color="0.93", zorder=0)


def _label_phases(ax, frame: pd.DataFrame, min_gap: float = 0.05) -> None:
    """Name the phases above the plot; a label closer than ``min_gap`` of the time axis to the previous
    one is left out, so short phases (an epoch of a few seconds) do not print over each other."""
    mine = this_process_rows(frame)
    gap = min_gap * (mine["seconds"].max() - mine["seconds"].min())
    last = None
    for _, span in mine.groupby((mine["phase"] != mine["phase"].shift()).cumsum()):
        start = span["seconds"].min()
        if span["phase"].iloc[0] and (last is None or start - last >= gap):
            ax.text(start, 1.02, span["phase"].iloc[0], transform=ax.get_xaxis_transform(),
                    fontsize=7, rotation=30, ha="left", va="bottom")
            last = start


def timeline(frame: pd.DataFrame, title: str = "") -> Figure:
    """Utilization, memory and power over time on shared axes, phases shaded and labelled."""
    fig, (util_ax, mem_ax, power_ax) = plt.subplots(3, 1, figsize=(10, 6.5), sharex=True)
    for index, device in frame.groupby("index"):
        label = f"{index}: {device['name'].iloc[0]}"
        util_ax.plot(device["seconds"], device["utilization_percent"], label=label)
        mem_ax.plot(device["seconds"], device["memory_used_mib"] / 1024, label=label)
        if device["power_watts"].notna().any():
            line, = power_ax.plot(device["seconds"], device["power_watts"], label=label)
            limit = device["power_limit_watts"].max()
            if pd.notna(limit):
                power_ax.axhline(limit, color=line.get_color(), ls="--", lw=0.8, label=f"{index}: limit")
    total = frame["memory_total_mib"].max()
    if pd.notna(total):
        mem_ax.axhline(total / 1024, color="0.4", ls="--", lw=0.8, label="capacity")
    util_ax.set(ylabel="utilization (%)", ylim=(0, 105))
    mem_ax.set(ylabel="memory (GiB)")
    power_ax.set(ylabel="power (W)", xlabel="seconds since the monitor started")
    if not frame["power_watts"].notna().any():
        power_ax.text(0.5, 0.5, "this backend reports no power", transform=power_ax.transAxes, ha="center")
    for ax in (util_ax, mem_ax, power_ax):
        _shade_phases(ax, frame)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=7)
    _label_phases(util_ax, frame)
    fig.suptitle(title or "Device timeline", y=1.0)
    fig.tight_layout()
    return fig


def live(monitor: Monitor, refresh: float = 1.0):
    """A table of the latest readings that refreshes while ``monitor`` runs, in a live JupyterLab.

    Returns the widget, or None where nobody watches (nbval, CI, scripts): no thread is started then.
    """
    if not interactive():
        return None
    import ipywidgets
    from IPython.display import display

    widget = ipywidgets.HTML()
    display(widget)

    def refresh_loop() -> None:
        while monitor.running:
            frame = monitor.frame()
            if not frame.empty:
                latest = frame[frame["seconds"] == frame["seconds"].max()]
                columns = ["index", "phase", "utilization_percent", "memory_used_mib", "power_watts"]
                widget.value = latest[columns].round(1).to_html(index=False)
            threading.Event().wait(refresh)

    threading.Thread(target=refresh_loop, name="course-monitor-view", daemon=True).start()
    return widget
