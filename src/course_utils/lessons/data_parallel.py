"""The measured comparisons of data parallelism (notebooks 06-08): each one trains for real and returns a table.

Single-process runs happen in this process; DDP runs start torchrun through :mod:`course_utils.parallel.launch`, so
a notebook cell shows their output as it comes. On a machine without GPUs, "devices" are CPU
processes: DDP runs two gloo ranks, each with one thread, on the same cores a single process uses.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from course_utils import config, devices
from course_utils.data.loaders import shard_sampler
from course_utils.lessons import spread
from course_utils.observe import communication
from course_utils.observe.metrics import load_run
from course_utils.observe.profiling import TRACE_FILE
from course_utils.parallel.launch import LaunchResult, launch
from course_utils.run_folder import RunFolder
from course_utils.train import train
from course_utils.training import checkpoint, models
from course_utils.training.options import to_flags

CPU_RANKS = 2  # DDP ranks on a machine without GPUs
MEASURED_STEPS = {"ci": 12, "workshop": 200}  # iterations of each throughput measurement of 06-10, by course size
# The runs a lesson makes in its own folders: no progress bar each, and a rerun replaces what the last left.
SCRATCH = {"progress": False, "overwrite": True}


def iterations_per_epoch(samples: int, batch: int, ranks: Sequence[int]) -> pd.DataFrame:
    """What DistributedSampler gives each rank of an epoch of ``samples``, at ``batch`` per rank."""
    rows = []
    for count in ranks:
        share = len(shard_sampler(range(samples), 0, count))
        rows.append({"ranks": count, "samples_per_rank": share, "iterations_per_rank": share // batch,
                     "global_batch": batch * count, "images_per_epoch": share // batch * batch * count})
    return pd.DataFrame(rows)


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

    def describe(self) -> str:
        """One sentence for the notebooks: where the ranks run, and what to ask for to see more."""
        if self.on_gpus:
            return f"{self.ranks} ranks, one per GPU, talking through NCCL/RCCL"
        here = "one GPU here" if self.gpus == 1 else "no GPU here"
        return (f"{here}: the {self.ranks} ranks are CPU processes talking through gloo. They show what DDP does, "
                "not GPU speed or GPU communication; for those, ask for 2 or more GPUs (on LUMI, the Jupyter app or "
                "an sbatch with --gpus-per-node=2 or more, up to 8 GCDs per node)")


def parallel_shape(gpus: int | None = None) -> ParallelShape:
    """The :class:`ParallelShape` of this machine (or of one with ``gpus`` GPUs)."""
    gpus = gpu_count() if gpus is None else gpus
    return ParallelShape(gpus, gpus, "auto") if gpus >= 2 else ParallelShape(gpus, CPU_RANKS, "cpu")


def run_ranks(nproc: int, out: Path, echo: bool = False, distributed: str = "ddp", env: dict[str, str] | None = None,
              **options: Any) -> LaunchResult:
    """``options`` trained with DDP (or FSDP) on ``nproc`` ranks under torchrun; the launch, with the run's
    summary and every rank's output, or an error with the end of torchrun's output when a rank failed.
    ``env``: variables for the ranks."""
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


def iteration_spread(summary: dict[str, Any]) -> float:
    """How much rank 0's iterations of a finished run varied (:func:`course_utils.lessons.spread.relative_spread`),
    the first two left out."""
    return spread.relative_spread(list(load_run(summary["config"]["out"]).iterations["seconds"])[2:])


def _row(name: str, summary: dict[str, Any], devices: int) -> dict[str, Any]:
    memory = summary.get("peak_memory_per_gpu_mib")
    ranks = summary["per_rank"]
    return {"mode": name, "processes": summary["world_size"], "devices": devices,
            "global_batch": summary["global_batch_size"], "images_per_second": summary["images_per_second"],
            "images_per_second_per_device": summary["images_per_second"] / devices,
            "steady_iteration_seconds": max(r["steady_iteration_seconds"] for r in ranks),
            "iteration_spread": iteration_spread(summary),
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
            rows.append(_row("one device", train(**common, batch_size=batch, out=out / "none"), 1))
        elif mode == "dp":
            dp_devices = max(1, gpus)
            rows.append(_row(f"DataParallel, {dp_devices} device(s)",
                             train(**common, batch_size=batch * dp_devices, distributed="dp", out=out / "dp"),
                             dp_devices))
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


def dataparallel_profile(steps: int | None = None, out: str | Path | None = None, **options: Any
                         ) -> pd.DataFrame | None:
    """DataParallel over every visible GPU, traced with the profiler, at the per-GPU batch of
    :func:`compare_modes`: the median step's time in each of DataParallel's phases, in ms and as a share of the
    step (:func:`course_utils.observe.communication.dataparallel_phases`). None with fewer than two GPUs, where
    DataParallel calls the model directly and has no phase to measure."""
    gpus = gpu_count()
    if gpus < 2:
        return None
    size = config.get_size(options.get("size"))
    batch = options.pop("batch_size", None) or size.batch_size
    folder = Path(out or config.runs_dir() / "dataparallel-profile")
    train(**{**SCRATCH, **options}, max_steps=steps or measured_steps(size.name), batch_size=batch * gpus,
          distributed="dp", trace=str(folder / "trace"), out=folder)
    median = communication.dataparallel_phases(folder / "trace" / TRACE_FILE).median()
    phases = [name.removesuffix("_ms") for name in median.index if name != "step_ms"]
    return pd.DataFrame([{"phase": phase, "ms": median[f"{phase}_ms"],
                          "percent_of_step": 100 * median[f"{phase}_ms"] / median["step_ms"]} for phase in phases]
                        + [{"phase": "whole step", "ms": median["step_ms"], "percent_of_step": 100.0}])


def _difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    floats = [name for name in a if a[name].is_floating_point()]
    absolute = max((a[n] - b[n]).abs().max().item() for n in floats)
    scale = max(b[n].abs().max().item() for n in floats)
    agree = all(torch.allclose(a[n], b[n], rtol=1e-5, atol=1e-6) for n in floats)
    return {"max_abs_difference": absolute, "relative_to_largest_weight": absolute / scale, "agree": agree}


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(RunFolder(out).last_checkpoint)["model"]


def ddp_equals_large_batch(models: Sequence[str] = ("small_cnn_gn", "small_cnn"), nproc: int | None = None,
                           batch: int = 16, steps: int = 8, out: str | Path | None = None,
                           **options: Any) -> pd.DataFrame:
    """Parameters after ``steps`` steps: DDP on ``nproc`` ranks at ``batch`` each against one process
    at ``nproc * batch``, and against one process at ``batch`` (a different training, as a control).

    Augmentation is off so that both see the same pixels; the shared sampler order (see
    :func:`course_utils.data.shard_sampler`) makes the images of each step the same set.
    """
    shape = parallel_shape()
    nproc = nproc or shape.ranks
    out = Path(out or config.runs_dir() / "ddp-equivalence")
    # Every run on the same kind of device: the comparison is of arithmetic, not of hardware.
    common = {"max_steps": steps, "augment": False, "workers": 0, "seed": 0, "device": shape.device, **SCRATCH,
              **options}
    rows = []
    for model in tqdm(models, desc="models", unit="model"):
        run_ranks(nproc, out / f"{model}-ddp", model=model, batch_size=batch, **common)
        train(**common, model=model, batch_size=batch * nproc, out=out / f"{model}-large")
        train(**common, model=model, batch_size=batch, out=out / f"{model}-small")
        ddp = _weights(out / f"{model}-ddp")
        for other, label in ((f"{model}-large", f"one process, batch {batch * nproc}"),
                             (f"{model}-small", f"one process, batch {batch}")):
            rows.append({"model": model, "ddp": f"{nproc} ranks x batch {batch}", "compared_with": label,
                         **_difference(ddp, _weights(out / other))})
    return pd.DataFrame(rows)


DDP_KNOBS: dict[str, dict[str, Any]] = {
    "defaults (25 MB buckets)": {},
    "1 MB buckets, gradient_as_bucket_view, static_graph": {"bucket_cap_mb": 1, "gradient_as_bucket_view": True,
                                                            "static_graph": True},
}


def ddp_knobs(knobs: dict[str, dict[str, Any]] | None = None, nproc: int | None = None, steps: int | None = None,
              out: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """Images per second of DDP with each setting of its knobs, everything else equal."""
    shape = parallel_shape()
    nproc = nproc or shape.ranks
    options.setdefault("device", shape.device)
    steps = steps or measured_steps(options.get("size"))
    out = Path(out or config.runs_dir() / "ddp-knobs")
    rows = []
    for index, (name, knob) in enumerate(tqdm((knobs or DDP_KNOBS).items(), desc="settings", unit="run")):
        summary = run_ranks(nproc, out / f"setting-{index}", max_steps=steps, **options, **knob).summary
        rows.append({"setting": name, "images_per_second": summary["images_per_second"],
                     "steady_iteration_seconds": max(r["steady_iteration_seconds"] for r in summary["per_rank"]),
                     "global_batch": summary["global_batch_size"]})
    table = pd.DataFrame(rows)
    table["relative"] = table["images_per_second"] / table["images_per_second"].iloc[0]
    return table


def gradient_mib(model: str, image_size: int = 32) -> float:
    """The size of ``model``'s gradients in fp32: what DDP all-reduces every step, bucket by bucket."""
    return models.parameter_table((model,), image_size)[0]["parameters"] * 4 / 2**20


def communication_profile(buckets: int = 8, nproc: int | None = None, steps: int | None = None,
                          out: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """DDP runs traced with the profiler, with PyTorch's default 25 MB buckets and with buckets small
    enough for about ``buckets`` of them: per setting, the median step's time, its communication, and
    how much of that hid behind computation (rank 0's trace; :mod:`course_utils.observe.communication`)."""
    shape = parallel_shape()
    size = config.get_size(options.get("size"))
    options = {"device": shape.device, "max_steps": steps or measured_steps(size.name), **options}
    gradients = gradient_mib(options.get("model") or size.model, options.get("image_size") or size.image_size)
    rows = []
    for index, cap in enumerate(tqdm((25.0, round(gradients / buckets, 3)), desc="bucket sizes", unit="run")):
        folder = Path(out or config.runs_dir() / "ddp-communication") / f"bucket-{index}"
        steps_table, _ = traced_ranks(nproc or shape.ranks, folder, bucket_cap_mb=cap, **options)
        rows.append({"bucket_cap_mb": cap, "gradient_mib": gradients, "buckets": max(1, math.ceil(gradients / cap)),
                     **steps_table.median().to_dict()})
    return pd.DataFrame(rows)


def interrupted_run(out: str | Path, stop_after_step: int, stop: signal.Signals = signal.SIGUSR1,
                    **options: Any) -> dict[str, Any]:
    """Start a new run of the training command in ``out``, send it ``stop`` once a checkpoint at
    ``stop_after_step`` or later exists (as Slurm does before a time limit), and report how it ended."""
    out = Path(out)
    folder = RunFolder(out).checkpoints
    flags = to_flags(**{**SCRATCH, **options}, out=out)
    started = time.time()
    process = subprocess.Popen([sys.executable, "-m", "course_utils.train", *flags], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    while process.poll() is None:
        saved = [int(path.stem.split("-")[1]) for path in folder.glob("step-*.pt")
                 if path.stat().st_mtime >= started]  # not the checkpoints of an earlier run, being removed
        if saved and max(saved) >= stop_after_step:
            process.send_signal(stop)
            break
        time.sleep(0.05)
    output = process.communicate(timeout=600)[0]
    marker = RunFolder(out).preempted
    return {"exit_code": process.returncode, "signal": stop.name,
            "marker": marker.read_text().strip() if marker.exists() else None,
            "checkpoints": sorted(path.name for path in folder.glob("*.pt")), "output": output.strip()}
