"""Notebooks 06, 07, 08, 09, 10, 11 and 12: what the parallel lessons share: where their ranks run, how they
start, how many steps they measure and how much those steps vary, and one device against DataParallel and DDP.

Every row carries its run's images per second iteration by iteration (:mod:`course_utils.observe.noise`), which
the answers compare; a figure outside what the work allows (above the ideal, a cost below nothing) is a disturbed
measurement, not a finding.

Single-process runs happen in this process; DDP runs start torchrun through :mod:`course_utils.parallel.launch`, so
a notebook cell shows their output as it comes. On a machine without GPUs, "devices" are CPU
processes: DDP runs two gloo ranks, each with one thread, on the same cores a single process uses, and a single
process set beside them computes with one thread too (:func:`threads_of_a_rank`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure
from tqdm.auto import tqdm

from course_utils import config, devices
from course_utils.observe import communication
from course_utils.observe.metrics import load_run
from course_utils.observe.noise import Measurement
from course_utils.observe.profiling import TRACE_FILE
from course_utils.parallel.launch import LaunchResult, launch
from course_utils.run_folder import RunFolder
from course_utils.train import train
from course_utils.training.options import to_flags

CPU_RANKS = 2  # DDP ranks on a machine without GPUs
MEASURED_STEPS = {"ci": 12, "workshop": 200}  # iterations of each throughput measurement of 06-10, by course size
# The runs a lesson makes in its own folders: no progress bar each, and a rerun replaces what the last left.
SCRATCH = {"progress": False, "overwrite": True}


RANK_THREADS = 1  # threads of each CPU rank: torchrun's own OMP_NUM_THREADS for several ranks, set for one too


def cpu_ranks(options: dict[str, Any]) -> bool:
    """Whether runs with these training options compute on CPU processes (``device="cpu"``, or no GPU)."""
    return options.get("device") == "cpu" or gpu_count() == 0


@contextmanager
def threads_of_a_rank(on_cpu: bool) -> Iterator[None]:
    """One process set beside CPU ranks computes with the threads of one rank, so that the comparison is of
    like against like: PyTorch's default would give it every core while each rank gets one."""
    if not on_cpu:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(RANK_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measured_steps(size: str | None = None) -> int:
    """Iterations of each throughput measurement of notebooks 06-10 at ``size`` (the active size by default)."""
    return MEASURED_STEPS[config.get_size(size).name]


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class ParallelShape:
    """How the DDP lessons run on this machine, and what they cannot show here.

    NCCL and RCCL take one GPU per rank (two ranks on one GPU fail with "Duplicate GPU detected"),
    so with fewer than two GPUs the ranks are CPU processes that talk through gloo: they show what
    DDP does (the same parameters as one large batch, the sampler's shares, the knobs), not how fast
    GPUs do it.
    """

    gpus: int
    ranks: int
    device: str  # the training command's --device for every run of a lesson: "auto" (one GPU per rank) or "cpu"

    @property
    def on_gpus(self) -> bool:
        return self.device != "cpu"

    @property
    def rank_device(self) -> torch.device:
        """The device rank 0 trains on (what tables and records name)."""
        return devices.default_device() if self.on_gpus else torch.device("cpu")

    def rows_label(self) -> str:
        """What a benchmark's rows say about where their ranks ran: a CPU figure from a GPU node is not a GPU
        figure, and says so."""
        if self.on_gpus:
            return f"{self.ranks} GPUs, one rank each"
        here = "a node with one GPU" if self.gpus == 1 else "a machine without GPUs"
        return f"CPU processes (gloo) on {here}: CPU figures, not GPU figures"

    def describe(self) -> str:
        """One sentence for the notebooks: where the ranks run, and what to ask for to see more."""
        if self.on_gpus:
            return f"{self.ranks} ranks, one per GPU, talking through NCCL/RCCL"
        here = "one GPU here" if self.gpus == 1 else "no GPU here"
        return (f"{here}: the {self.ranks} ranks are CPU processes talking through gloo, one thread each (and one "
                "process set beside them gets one thread too). They show the mechanics, the memory each rank holds "
                "and the bytes the ranks move, not GPU speed-ups or GPU communication; for those, ask for 2 or more "
                "GPUs (on LUMI, the Jupyter app or an sbatch with --gpus-per-node=2 or more, up to 8 GCDs per node)")


def parallel_shape(gpus: int | None = None) -> ParallelShape:
    """The :class:`ParallelShape` of this machine (or of one with ``gpus`` GPUs)."""
    gpus = gpu_count() if gpus is None else gpus
    return ParallelShape(gpus, gpus, "auto") if gpus >= 2 else ParallelShape(gpus, CPU_RANKS, "cpu")


def run_ranks(nproc: int, out: Path, echo: bool = False, distributed: str = "ddp", env: dict[str, str] | None = None,
              **options: Any) -> LaunchResult:
    """``options`` trained with DDP (or FSDP) on ``nproc`` ranks under torchrun; the launch, with the run's
    summary and every rank's output, or an error with the end of torchrun's output when a rank failed.
    ``env``: variables for the ranks."""
    if cpu_ranks(options):  # one rank gets the threads of each of several, as torchrun gives them
        env = {"OMP_NUM_THREADS": str(RANK_THREADS), **(env or {})}
    result = launch(nproc, "course_utils.train", *to_flags(**{**SCRATCH, **options}, distributed=distributed,
                                                           out=out),
                    log_dir=Path(out).parent / f"{Path(out).name}-logs", echo=echo, env=env)
    if not result.ok:
        tail = "\n".join(result.lines[-15:])
        raise RuntimeError(f"{distributed.upper()} on {nproc} ranks failed (exit {result.returncode}):\n{tail}")
    return result


def traced_ranks(nproc: int, out: Path, **options: Any) -> tuple[pd.DataFrame, LaunchResult]:
    """:func:`run_ranks` with rank 0 traced by the profiler: each traced step's communication and what of it
    hid behind computation (:func:`course_utils.observe.communication.per_step`), and the launch."""
    result = run_ranks(nproc, out, trace=Path(out) / "trace", **options)
    return communication.per_step(Path(out) / "trace" / TRACE_FILE), result


def measured_rate(summary: dict[str, Any]) -> Measurement:
    """A finished run's images per second, iteration by iteration after its warm-up, with their spread; no
    samples (an unknown spread) where its run folder is not at hand (a summary copied from elsewhere)."""
    out = summary.get("config", {}).get("out")
    if not out or not RunFolder(out).metrics.exists():
        return Measurement.of([])
    return load_run(out).steady_rate()


def _row(name: str, summary: dict[str, Any], devices: int) -> dict[str, Any]:
    memory = summary.get("peak_memory_per_gpu_mib")
    ranks = summary["per_rank"]
    measured = measured_rate(summary)
    return {"mode": name, "processes": summary["world_size"], "devices": devices,
            "global_batch": summary["global_batch_size"], "images_per_second": summary["images_per_second"],
            "images_per_second_per_device": summary["images_per_second"] / devices,
            "steady_iteration_seconds": max(r["steady_iteration_seconds"] for r in ranks),
            "measured": measured, "spread": measured.spread,
            "steps_per_rank": [r["steps"] for r in ranks],
            "peak_memory_per_device_mib": ([r["peak_memory_mib"] for r in ranks] if summary["world_size"] > 1
                                           else memory[:devices] if memory else None),
            "final_train_loss": summary["final_train_loss"], "monitor": summary.get("monitor")}


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


def compare_modes(modes: Sequence[str] = ("none", "dp", "ddp"), steps: int | None = None, out: str | Path | None = None,
                  ddp_summary: dict[str, Any] | None = None, **options: Any) -> pd.DataFrame:
    """One device, DataParallel and DDP on the same per-device batch, for the same number of steps.

    DataParallel gets the per-device batch times its GPU count (it splits one batch), DDP runs one
    process per device with the per-device batch; so every mode puts the same work on each device.
    ``ddp_summary``: a DDP run made already with the same settings, used instead of a new one when it has
    the ranks and steps this comparison needs (on one GPU a run of two CPU ranks does not: it runs one rank on
    the GPU).
    Every run is monitored: :func:`device_readings` lists each device's utilization, memory and power.
    """
    size = config.get_size(options.get("size"))
    batch = options.pop("batch_size", None) or size.batch_size
    steps = steps or measured_steps(size.name)
    out = Path(out or config.runs_dir() / "parallel-modes")
    gpus = gpu_count()
    ddp_ranks = gpus or CPU_RANKS  # one rank per device, as in the other modes; on one GPU, DDP's own cost
    rows = []
    for mode in tqdm(modes, desc="modes", unit="run"):
        common = {"max_steps": steps, "monitor": "auto", **SCRATCH, **options}
        if mode == "none":
            with threads_of_a_rank(cpu_ranks(common)):
                rows.append(_row("one device", train(**common, batch_size=batch, out=out / "none"), 1))
        elif mode == "dp":
            dp_devices = max(1, gpus)
            with threads_of_a_rank(cpu_ranks(common)):
                summary = train(**common, batch_size=batch * dp_devices, distributed="dp", out=out / "dp")
            rows.append(_row(f"DataParallel, {dp_devices} device(s)", summary, dp_devices))
        elif mode == "ddp":
            reusable = (ddp_summary is not None and ddp_summary["world_size"] == ddp_ranks
                        and ddp_summary["steps"] == steps)
            summary = ddp_summary if reusable else run_ranks(ddp_ranks, out / "ddp", batch_size=batch, **common).summary
            rows.append(_row(f"DDP, {summary['world_size']} ranks", summary, summary["world_size"]))
        else:
            raise ValueError(f"unknown mode {mode!r}; choose from none, dp, ddp")
    table = pd.DataFrame(rows)
    table["speedup"] = table["images_per_second"] / table["images_per_second"].iloc[0]
    return table


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
