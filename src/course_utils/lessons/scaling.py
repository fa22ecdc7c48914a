"""Notebook 08: what the scaling studies (:mod:`course_utils.experiments.scaling_studies`), the large-batch
learning rate and the all-reduce's bandwidth showed, in answers and plots, and the check of the exercise on the
bus bandwidth.

Ideal is a speed-up equal to the rank count; efficiency is the measured speed-up divided by it. Every answer
reads a figure through its run's spread (:mod:`course_utils.observe.noise`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_utils.observe.metrics import load_run
from course_utils.observe.noise import DISTURBED, compare
from course_utils.tooling.exercises import Check


def scaling_answer(tables: dict[str, pd.DataFrame]) -> str:
    """Markdown: how well each study scaled, at its largest rank count."""
    lines = []
    for name, table in tables.items():
        first, last = table.iloc[0], table.iloc[-1]
        speedup = compare(last["measured"], first["measured"], bound=(0, last["ideal"]),
                          why=f"{int(last['ranks'])} ranks do at most {last['ideal']:g}x the work of "
                              f"{int(first['ranks'])}")
        efficiency = ("" if speedup.verdict == DISTURBED else
                      f" ({last['efficiency']:.0%} efficiency, the speed-up over the ideal)")
        lines.append(f"- **{name}**: {int(last['ranks'])} ranks against {int(first['ranks'])}, global batch "
                     f"{int(last['global_batch'])}: {speedup.sentence()}{efficiency}")
    lines.append("- Strong scaling shrinks each rank's batch, so compute per step falls while the all-reduce stays the "
                 "same size: efficiency drops first there. Weak scaling keeps each rank busy and is limited by the "
                 "all-reduce and by stragglers; on CPU processes that share cores it also shows the cores running out.")
    return "\n".join(lines)


def lr_answer(table: pd.DataFrame) -> str:
    """Markdown: what a larger global batch needs from the learning rate, from the cases just trained."""
    base = table.iloc[0]
    lines = []
    for row in table.itertuples():
        if row.status != "ok":
            lines.append(f"- **{row.case}**: {row.status}.")
            continue
        lines.append(f"- **{row.case}**: {row.steps:.0f} steps, final training loss {row.final_train_loss:.3f}, "
                     f"test top-1 {row.test_top1:.1f} % (base batch: {base['test_top1']:.1f} %).")
    factor = int(table.iloc[1]["batch"] // base["batch"])
    lines.append(f"- With {factor}x the batch an epoch has {factor}x fewer steps: at the same learning rate the model "
                 "moves less per epoch. Scaling the rate with the batch (the linear rule) restores the distance "
                 "travelled; the warm-up avoids the large early steps that can throw a freshly initialised network "
                 "off course, which is where an unwarmed large rate loses accuracy or diverges.")
    return "\n".join(lines)


def allreduce_answer(table: pd.DataFrame) -> str:
    """Markdown: latency and bandwidth of the all-reduce just measured."""
    small, large = table.iloc[0], table.iloc[-1]
    return "\n".join([
        f"- {int(large['world_size'])} ranks over **{large['backend']}**: the smallest message "
        f"({int(small['bytes'])} B) "
        f"took **{small['seconds'] * 1e6:.0f} µs**, almost all latency; the largest ({int(large['bytes']) / 2**20:.0f} "
        f"MiB) reached a bus bandwidth of **{large['bus_gb_per_s']:.2f} GB/s**.",
        "- Compare the large-message bus bandwidth with the link: NVLink 3/4 carries a few hundred GB/s per "
        "direction, Infinity Fabric between MI250X GCDs 50-200 GB/s, a Slingshot-11 port 25 GB/s. Far below "
        "the link means the transport is not the one you think (NCCL_DEBUG=INFO tells).",
    ])


def plot_scaling(tables: dict[str, pd.DataFrame]) -> Figure:
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


def plot_allreduce(table: pd.DataFrame) -> Figure:
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


def plot_lr(table: pd.DataFrame) -> Figure:
    """Training loss of each learning-rate case that finished against the epochs seen, overlaid: an epoch of
    a larger batch has fewer steps, so the x axis is in epochs."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for row in table[table["status"] == "ok"].itertuples():
        steps = load_run(row.run).steps
        ax.plot(steps["step"] / steps["step"].max() * steps["epoch"].max(), steps["loss"], label=row.case, alpha=0.85)
    ax.set(xlabel="epochs", ylabel="training loss", title="Large batch: learning rate and warm-up")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _bus_hint(factor: float, ranks: int) -> str:
    """What a learner's bus bandwidth did, from its factor to the algorithm bandwidth on ``ranks`` ranks."""
    ring = 2 * (ranks - 1) / ranks
    if math.isclose(factor, 1, rel_tol=1e-6):
        return "yours is the algorithm bandwidth, bytes over time, unchanged"
    if math.isclose(factor, ring / 2, rel_tol=1e-6):
        return (f"yours multiplies it by (n-1)/n = {ring / 2:.3g}: a ring all-reduce passes the message around twice, "
                "once to add the pieces up and once to share the sums")
    if math.isclose(factor * 2**30 / 1e9, ring, rel_tol=1e-6):
        return "yours counts GiB (2**30 bytes); the course's GB/s are 1e9 bytes"
    return f"yours is {factor:.4g} times the algorithm bandwidth on {ranks} ranks"


def check_bus_bandwidth(bus_bandwidth: Callable[[float, float, int], float], measured: pd.DataFrame,
                        ranks: tuple[int, ...] = (2, 4, 8)) -> Check:
    """The check of notebook 08's exercise: does the learner's ``bus_bandwidth(bytes, seconds, ranks)`` give
    what the all-reduce measurement computed, on the ranks it ran and on more (where the two bandwidths part)?"""
    for row in measured.itertuples():
        for count in sorted({int(row.world_size), *ranks}):
            expected = row.algorithm_gb_per_s * 2 * (count - 1) / count
            mine = bus_bandwidth(row.bytes, row.seconds, count)
            if not math.isclose(mine, expected, rel_tol=1e-6, abs_tol=1e-12):
                return Check(False, f"for {int(row.bytes)} bytes on {count} ranks the bus bandwidth is "
                                    f"{expected:.4g} GB/s and your function gives {mine:.4g}: "
                                    f"{_bus_hint(mine / row.algorithm_gb_per_s, count)}. Each link of a ring carries "
                                    f"2(n-1)/n of the message: {2 * (count - 1) / count:.3g} on {count} ranks.")
    return Check(True, f"your bus bandwidth matches all {len(measured)} measured sizes, on "
                       f"{measured['world_size'].iloc[0]} ranks and on {', '.join(map(str, ranks))}.")

