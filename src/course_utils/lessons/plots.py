"""Notebooks 06, 07, 08 and 09: the figures of the parallel lessons (runs, scaling, all-reduce, memory).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_utils.observe.metrics import load_run


def _loss_curves(table: pd.DataFrame, label: str, title: str, in_epochs: bool = False) -> Figure:
    """The training loss of every run of ``table`` that finished (``status`` ok), overlaid; the x axis
    in iterations, or in epochs to compare runs whose epochs have different step counts."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for row in table[table["status"] == "ok"].itertuples():
        steps = load_run(row.run).steps
        x = steps["step"] / steps["step"].max() * steps["epoch"].max() if in_epochs else steps["step"]
        ax.plot(x, steps["loss"], label=getattr(row, label), alpha=0.85)
    ax.set(xlabel="epochs" if in_epochs else "iteration", ylabel="training loss", title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def parallel_modes(table: pd.DataFrame) -> Figure:
    """Images per second of each way of training, and each device's peak memory where it was measured."""
    with_memory = table.dropna(subset=["peak_memory_per_device_mib"])
    with_memory = with_memory[with_memory["peak_memory_per_device_mib"].map(lambda m: m is not None and None not in m)]
    panels = 2 if len(with_memory) else 1
    fig, axes = plt.subplots(1, panels, figsize=(10 if panels == 2 else 7, 3.2), squeeze=False)
    ax = axes[0][0]
    bars = ax.barh(table["mode"], table["images_per_second"], color="tab:blue")
    for bar, speedup in zip(bars, table["speedup"]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {speedup:.2f}x", va="center")
    ax.invert_yaxis()
    ax.set(xlabel="images per second (all devices)", title="Throughput")
    if panels == 2:
        ax = axes[0][1]
        for row in with_memory.itertuples():
            ax.plot(range(len(row.peak_memory_per_device_mib)), row.peak_memory_per_device_mib, "o-", label=row.mode)
        ax.set(xlabel="GPU index", ylabel="peak memory allocated (MiB)", title="Memory per GPU")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def scaling(tables: dict[str, pd.DataFrame]) -> Figure:
    """Speed-up against the ideal line, and parallel efficiency, for each study (e.g. strong, weak)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    most = max(int(t["ideal"].max()) for t in tables.values())
    left.plot([1, most], [1, most], "k--", lw=1, label="ideal")
    for name, table in tables.items():
        left.plot(table["ideal"], table["speedup"], "o-", label=name)
        right.plot(table["ranks"], 100 * table["efficiency"], "o-", label=name)
    left.set(xlabel="ranks (relative to the first run)", ylabel="speed-up", title="Speed-up")
    right.axhline(100, color="k", ls="--", lw=1)
    right.axhline(90, color="0.6", ls=":", lw=1, label="90 %")
    right.set(xlabel="ranks", ylabel="efficiency (%)", title="Parallel efficiency", ylim=(0, 110))
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def allreduce_bandwidth(table: pd.DataFrame) -> Figure:
    """Bus bandwidth and time per all-reduce against message size, log-log."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    left.loglog(table["bytes"], table["seconds"] * 1e6, "o-")
    left.set(xlabel="message size (bytes)", ylabel="time per all-reduce (µs)", title="Latency, then bandwidth")
    right.semilogx(table["bytes"], table["bus_gb_per_s"], "o-", label="bus bandwidth")
    right.semilogx(table["bytes"], table["algorithm_gb_per_s"], ".:", label="algorithm bandwidth")
    right.set(xlabel="message size (bytes)", ylabel="GB/s", title="Bandwidth")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def lr_scaling(table: pd.DataFrame) -> Figure:
    """Training loss of each learning-rate case against the epochs seen, overlaid."""
    return _loss_curves(table, "case", "Large batch: learning rate and warm-up", in_epochs=True)


def memory_ladder(table: pd.DataFrame) -> Figure:
    """Memory per rank by kind, stacked, for each rung of the ladder; its speed beside it."""
    measured = table.dropna(subset=["total_mib"]) if "total_mib" in table else table.iloc[:0]
    kinds = [("parameters_mib", "parameters"), ("gradients_mib", "gradients"),
             ("optimizer_state_mib", "optimizer state"), ("activations_mib", "saved activations")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    start = pd.Series(0.0, index=measured.index)
    for column, label in kinds:
        left.barh(measured["rung"], measured[column], left=start, label=label)
        start += measured[column]
    peaks = measured.dropna(subset=["peak_allocated_mib"])
    if len(peaks):
        left.scatter(peaks["peak_allocated_mib"], peaks["rung"], marker="|", s=300, color="black",
                     label="allocator's peak", zorder=3)
    left.invert_yaxis()
    left.set(xlabel="MiB per rank", title="Memory of one training step, per rank")
    left.legend(fontsize=7, loc="lower right")
    right.barh(measured["rung"], measured["images_per_second"], color="tab:gray")
    right.invert_yaxis()
    right.set(xlabel="images per second (all ranks)", title="Speed", yticklabels=[])
    fig.tight_layout()
    return fig
