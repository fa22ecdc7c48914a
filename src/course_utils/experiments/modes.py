"""One device against DataParallel and DDP on the same per-device batch (notebooks 06 and 07, and
``benchmarks/parallel_modes.py``): each way of training is a :class:`~course_utils.experiments.runs.Variant` whose
``distributed`` option says how it runs ("none", "dp" or "ddp"), and whatever else it sets (a bucket size, a
precision) changes that run alone. Every run is monitored: :func:`device_readings` lists each device's
utilization, memory and power.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_utils import config
from course_utils.experiments.machine_shape import CPU_RANKS, cpu_ranks, gpu_count, threads_of_a_rank
from course_utils.experiments.runs import (
    SCRATCH,
    Variant,
    measured_rate,
    measured_steps,
    refuse_options,
    run_ranks,
    run_variants,
)
from course_utils.parallel.layout import MODES, mode_of
from course_utils.train import train

ONE_DEVICE = Variant("one device")
DATA_PARALLEL = Variant("DataParallel", distributed="dp")
DDP = Variant("DDP", distributed="ddp")
SET_FOR_EVERY_MODE = {  # what compare_modes sets alike for each mode, so that they do the same work
    "out": "each mode's run folder is out / the mode's name; pass out= to compare_modes",
    "batch_size": "every mode trains the same batch per device; pass batch_size= to compare_modes",
    "max_steps": "every mode trains the same number of steps; pass steps= to compare_modes",
}


def whole_model_modes() -> tuple[str, ...]:
    """The ``distributed`` values a compared mode may take: every mode of :data:`course_utils.parallel.layout.MODES`
    in which each device holds the whole model (none, dp, ddp), as the comparison puts the same work on each."""
    return tuple(name for name, facts in MODES.items() if not facts.sharded)


def mode_row(summary: dict[str, Any], devices: int) -> dict[str, Any]:
    """What a comparison of modes reads from one finished run on ``devices`` devices."""
    memory = summary.get("peak_memory_per_gpu_mib")
    ranks = summary["per_rank"]
    measured = measured_rate(summary)
    return {"processes": summary["world_size"], "devices": devices,
            "global_batch": summary["global_batch_size"], "images_per_second": summary["images_per_second"],
            "images_per_second_per_device": summary["images_per_second"] / devices,
            "steady_iteration_seconds": max(r["steady_iteration_seconds"] for r in ranks),
            "measured": measured, "spread": measured.spread,
            "steps_per_rank": [r["steps"] for r in ranks],
            "peak_memory_per_device_mib": ([r["peak_memory_mib"] for r in ranks] if summary["world_size"] > 1
                                           else memory[:devices] if memory else None),
            "final_train_loss": summary["final_train_loss"], "monitor": summary.get("monitor")}


def first_of(modes: pd.DataFrame, how: str) -> pd.Series | None:
    """The first row of :func:`compare_modes`'s table that ran as ``how`` ("none", "dp", "ddp"): the one an answer
    reads when the learner added further rows of the same kind; None when there is none."""
    rows = modes[modes["distributed"] == how]
    return rows.iloc[0] if len(rows) else None


def compare_modes(modes: Sequence[Variant] = (ONE_DEVICE, DATA_PARALLEL, DDP), steps: int | None = None,
                  out: str | Path | None = None, ddp_summary: dict[str, Any] | None = None,
                  **options: Any) -> pd.DataFrame:
    """Each mode trained for the same number of steps with the same per-device batch, ``options`` common to all.

    DataParallel gets the per-device batch times its GPU count (it splits one batch), DDP runs one process per
    device with the per-device batch; so every mode puts the same work on each device. ``ddp_summary``: a DDP run
    made already with the same settings, used for a plain DDP mode instead of a new run when it has the ranks and
    steps this comparison needs (on one GPU a run of two CPU ranks does not: it runs one rank on the GPU).
    """
    size = config.get_size(options.get("size"))
    batch = options.pop("batch_size", None) or size.batch_size
    if "max_steps" in options:  # the command's name for steps: one number for every mode and the DDP run's reuse
        if steps is not None:
            raise ValueError(f"steps={steps} and max_steps={options['max_steps']} both set the steps every mode "
                             "trains: give one of them")
        steps = options.pop("max_steps")
    steps = steps or measured_steps(size.name)
    out = Path(out or config.runs_dir() / "parallel-modes")
    gpus = gpu_count()
    ddp_ranks = gpus or CPU_RANKS  # one rank per device, as in the other modes; on one GPU, DDP's own cost
    allowed = whole_model_modes()
    for mode in modes:
        if mode.options.get("distributed", "none") not in allowed:
            raise ValueError(f"mode {mode.name!r}: distributed={mode.options['distributed']!r}; a mode runs as one "
                             f"of {', '.join(allowed)}")
    refuse_options(modes, SET_FOR_EVERY_MODE)

    def run(mode: Variant) -> dict[str, Any]:
        how = mode.options.get("distributed", "none")
        facts = mode_of(how)
        common = {"max_steps": steps, "monitor": "auto", **SCRATCH, **options,
                  **{name: value for name, value in mode.options.items() if name != "distributed"}}
        folder = out / mode.folder_name
        if facts.one_process_per_device:
            reusable = (ddp_summary is not None and ddp_summary["world_size"] == ddp_ranks
                        and ddp_summary["steps"] == steps and mode.options == DDP.options)
            summary = ddp_summary if reusable else run_ranks(ddp_ranks, folder, distributed=how, batch_size=batch,
                                                                    **common).summary
            return {"mode": f"{mode.name}, {summary['world_size']} ranks", "distributed": how,
                    **mode_row(summary, summary["world_size"])}
        devices = max(1, gpus) if facts.all_gpus_in_one_process else 1
        with threads_of_a_rank(cpu_ranks(common)):
            summary = train(**common, batch_size=batch * devices, distributed=how, out=folder)
        name = f"{mode.name}, {devices} device(s)" if facts.all_gpus_in_one_process else mode.name
        return {"mode": name, "distributed": how, **mode_row(summary, devices)}

    table = run_variants(modes, run, desc="modes")
    table["speedup"] = table["images_per_second"] / table["images_per_second"].iloc[0]
    return table


def device_readings(modes: pd.DataFrame) -> pd.DataFrame:
    """Each device of each mode while it trained, as the monitor sampled it: utilization, peak memory and
    power (where the device reports it). Under DDP rank 0 samples every device of its node."""
    rows = []
    for mode in modes.itertuples():
        monitor = mode.monitor or {"backend": None, "devices": []}
        for device in monitor["devices"]:
            rows.append({"mode": mode.mode, "backend": monitor["backend"], "device": device["index"],
                         "utilization_percent": device["utilization_percent"],
                         "memory_peak_mib": device["memory_peak_mib"], "power_watts": device["power_watts"]})
    return pd.DataFrame(rows)


def plot_modes(table: pd.DataFrame) -> Figure:
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
