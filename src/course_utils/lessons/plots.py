"""The figures the notebooks share: runs, sweeps and profiles (every notebook, 00-09)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from torchvision.datasets import CIFAR100

from course_utils.data import cifar
from course_utils.observe.metrics import Run, load_run


def iteration_times(run: Run) -> Figure:
    """Every iteration's time, epochs shaded alternately: warm-up spikes stand out at a glance."""
    fig, ax = plt.subplots(figsize=(9, 3.5))
    its = run.iterations
    ax.plot(its["step"], its["seconds"] * 1000, lw=0.8, label="iteration")
    ax.plot(its["step"], its["data_seconds"] * 1000, lw=0.8, alpha=0.7, label="waiting for data")
    for epoch, group in its.groupby("epoch"):
        if epoch % 2 == 0:
            ax.axvspan(group["step"].min() - 0.5, group["step"].max() + 0.5, color="0.92", zorder=0)
    ax.set_yscale("log")
    ax.set(xlabel="iteration (shaded: every other epoch)", ylabel="milliseconds (log scale)",
           title=f"Time per iteration: {run.summary.get('config', {}).get('model', '')} on "
                 f"{run.summary.get('device', '')}")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


def epoch_times(run: Run) -> Figure:
    """Training time of each epoch (evaluation excluded), the first one highlighted."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    epochs = run.epochs
    colors = ["tab:red"] + ["tab:blue"] * (len(epochs) - 1)
    ax.bar(epochs["epoch"], epochs["seconds"], color=colors)
    ax.set(xlabel="epoch", ylabel="seconds", title="Training time per epoch (first in red)")
    ax.set_xticks(epochs["epoch"])
    fig.tight_layout()
    return fig


def learning_curves(run: Run) -> Figure:
    """Training loss at every log point and test accuracy after every epoch."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.5))
    loss_ax.plot(run.steps["step"], run.steps["loss"], label="train (logged steps)")
    loss_ax.plot(run.epochs["step"], run.epochs["test_loss"], "o-", label="test (per epoch)")
    loss_ax.set(xlabel="iteration", ylabel="cross-entropy loss", title="Loss")
    loss_ax.legend()
    acc_ax.plot(run.epochs["epoch"], run.epochs["test_top1"], "o-", label="top-1")
    acc_ax.plot(run.epochs["epoch"], run.epochs["test_top5"], "s--", label="top-5")
    acc_ax.axhline(1.0, color="0.5", lw=0.8, ls=":", label="chance (top-1)")
    acc_ax.set(xlabel="epoch", ylabel="test accuracy (%)", title="Accuracy", ylim=(0, 100))
    acc_ax.set_xticks(run.epochs["epoch"])
    acc_ax.legend()
    fig.tight_layout()
    return fig


def sample_grid(dataset: CIFAR100, count: int = 16) -> Figure:
    """The first ``count`` images of a CIFAR-100 set (no transform) with their class names, and a title
    that says whether they are photographs or the ``ci`` size's generated patterns."""
    columns = 8
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(columns * 1.3, rows * 1.5 + 0.4))
    for index, ax in enumerate(axes.flat):
        ax.axis("off")
        if index < count:
            ax.imshow(dataset.data[index])
            ax.set_title(dataset.classes[dataset.targets[index]], fontsize=7)
    generated = cifar.read_manifest(Path(dataset.root)) is not None
    fig.suptitle("generated CIFAR-100 (the ci size): a colour and stripe pattern per class under noise, not "
                 "photographs; the class names are the real ones" if generated else
                 "CIFAR-100: 32x32 photographs", fontsize=9)
    fig.tight_layout()
    return fig


def sweep_results(sweep: pd.DataFrame) -> Figure:
    """Throughput and peak memory against batch size, one line per model; x marks out of memory."""
    fig, (speed_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    for model, rows in sweep.groupby("model", sort=False):
        fits = rows[rows["status"] == "ok"]
        line, = speed_ax.plot(fits["batch_size"], fits["images_per_second"], "o-", label=model)
        memory_ax.plot(fits["batch_size"], fits["peak_memory_mib"] / 1024, "o-", color=line.get_color(), label=model)
        for batch in rows[rows["status"] != "ok"]["batch_size"]:
            for ax in (speed_ax, memory_ax):
                ax.plot([batch], [0], "x", color=line.get_color(), markersize=10, mew=2)
    speed_ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="images per second (log scale)",
                 title="Training throughput")
    memory_ax.set(xscale="log", xlabel="batch size", ylabel="peak memory (GiB)", title="Peak memory (x: did not fit)")
    batches = sorted(sweep["batch_size"].unique())
    for ax in (speed_ax, memory_ax):
        ax.minorticks_off()
        ax.set_xticks(batches, labels=[str(b) for b in batches])
        ax.legend()
    fig.tight_layout()
    return fig


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


def progression_losses(table: pd.DataFrame) -> Figure:
    """The training loss of every progression stage that ran, overlaid: the same training, faster or not."""
    return _loss_curves(table, "stage", "Loss curves of every stage")


def progression_speed(table: pd.DataFrame) -> Figure:
    """Images per second of every stage that ran, with its speed-up over the fp32 baseline."""
    ran = table[table["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(ran)))
    bars = ax.barh(ran["stage"], ran["images_per_second"], color="tab:blue")
    for bar, speedup in zip(bars, ran["speedup"]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {speedup:.2f}x", va="center")
    ax.invert_yaxis()
    ax.set(xlabel="images per second (steady state)", title="Precision and compilation, stage by stage")
    fig.tight_layout()
    return fig


def triage(table: pd.DataFrame) -> Figure:
    """IO, SYNTHETIC and FULL images/s side by side, one group per row of ``table`` (its "loader" or "case")."""
    ran = table.dropna(subset=["full"])
    label = "loader" if "loader" in ran else "case"
    fig, ax = plt.subplots(figsize=(8, 3.2))
    width = 0.27
    for offset, (column, name) in enumerate((("io", "IO only"), ("synthetic", "SYNTHETIC (model only)"),
                                             ("full", "FULL (training)"))):
        positions = [i + (offset - 1) * width for i in range(len(ran))]
        ax.bar(positions, ran[column], width, label=name)
    ax.set_xticks(range(len(ran)), ran[label])
    ax.set(ylabel="images per second", title="Input pipeline against model", yscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def loader_sweep(table: pd.DataFrame) -> Figure:
    """The loader alone and training with it against worker count, one line per combination of the
    other knobs: where the two panels disagree, the loader's speed is not what training gets."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    knobs = ["pin_memory", "persistent_workers", "prefetch_factor"]
    for ax, column, title in zip(axes, ("io", "full"), ("Loader alone (IO)", "Training with it (FULL)")):
        for values, rows in table[table["workers"] > 0].groupby(knobs):
            label = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in zip(knobs, values))
            ax.plot(rows["workers"], rows[column], "o-", label=label, alpha=0.8)
        for row in table[table["workers"] == 0].itertuples():
            ax.axhline(getattr(row, column), ls=":", color="0.4", label=f"no workers, pin_memory={row.pin_memory}")
        ax.set(xlabel="DataLoader workers", title=title)
        ax.set_xticks(sorted(table["workers"].unique()))
    axes[0].set(ylabel="images per second", yscale="log")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig
