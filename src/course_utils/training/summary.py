"""What a run reports when it ends: its steady-state throughput, timings, scores and memory, per rank
and for the whole job (notebooks 01-08 read it from ``summary.json``).
"""

from __future__ import annotations

import math
import os
import socket
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from course_utils import devices
from course_utils.data.datasets import class_count
from course_utils.observe import flops
from course_utils.observe.clocks import images_per_second, steady_median, warmup_steps
from course_utils.observe.memory import StepMemory
from course_utils.observe.monitor import Monitor
from course_utils.parallel.collectives import gather
from course_utils.training import models
from course_utils.training.detection_eval import METRICS
from course_utils.training.schedule import Plan
from course_utils.training.setup import Setup


@dataclass
class StepTimes:
    """This rank's logged iterations: each one's seconds, images and seconds spent waiting for data."""

    seconds: list[float] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    data_seconds: list[float] = field(default_factory=list)

    def add(self, seconds: list[float], images: list[int], data_seconds: list[float]) -> None:
        self.seconds += seconds
        self.images += images
        self.data_seconds += data_seconds


def rank_summary(setup: Setup, times: StepTimes, steps: int, skip: int, memory: StepMemory | None
                 ) -> dict[str, Any]:
    """This rank's own share: its iteration count, timings and the memory of its first step."""
    where, device = setup.where, setup.device
    # Under Slurm the node's name, which differs from the host name where nodes are virtual.
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return {"rank": where.rank, "local_rank": where.local_rank, "node": node,
            "device": str(device), "steps": steps, "images": sum(times.images),
            "images_per_second": images_per_second(times.seconds, times.images, skip),
            "steady_iteration_seconds": steady_median(times.seconds, skip),
            "data_seconds_median": statistics.median(times.data_seconds) if times.data_seconds else None,
            "peak_memory_mib": devices.peak_memory_mib(device),
            "step_memory_bytes": memory.as_dict() if memory else None}


def monitor_summary(monitor: Monitor) -> dict[str, Any]:
    """Means and peaks over the training phases (evaluation left out), per device."""
    frame = monitor.frame()
    devices_seen = []
    if not frame.empty:
        training = frame[frame["phase"].str.startswith("epoch")]
        per_device = training.groupby("index").agg(
            utilization_percent=("utilization_percent", "mean"), memory_peak_mib=("memory_used_mib", "max"),
            power_watts=("power_watts", "mean"), power_limit_watts=("power_limit_watts", "max"),
            this_process=("this_process", "any"))  # on a shared node, the others are neighbours' devices
        devices_seen = per_device.reset_index().to_dict("records")
    return {"backend": monitor.backend_name, "samples": len(frame), "interval": monitor.interval,
            "devices": devices_seen, "failure": monitor.failure}


def joules_per_image(monitor: dict[str, Any] | None, times: StepTimes) -> float | None:
    """Energy per image this process trained: its device's mean power while training, times its training
    time, over its images. None where the device reports no power (a CPU, an MI250X's secondary GCD);
    on an MI250X's primary GCD the power is the whole module's, both GCDs."""
    if not monitor or not monitor["devices"] or not times.images:
        return None
    mine = next((row for row in monitor["devices"] if row["this_process"]), monitor["devices"][0])
    watts = mine["power_watts"]
    if watts is None or math.isnan(watts):
        return None
    return watts * sum(times.seconds) / sum(times.images)


def run_summary(setup: Setup, plan: Plan, times: StepTimes, steps: int, epoch_records: list[dict[str, Any]],
                monitor: Monitor | None, resumed_from: str | None, memory: StepMemory | None
                ) -> dict[str, Any]:
    """The whole job's summary, the same on every rank (every rank takes part in gathering it)."""
    cfg, device, world = setup.cfg, setup.device, setup.where.world_size
    # Warm-up is paid by each process: after a resume, by the steps this one trained.
    skip = warmup_steps(plan.steps_per_epoch, plan.epochs, len(times.seconds))
    ranks = gather(rank_summary(setup, times, steps, skip, memory))
    last = epoch_records[-1]
    rate = sum(r["images_per_second"] for r in ranks)  # every rank trains its own images at the same time
    dp_devices = (len(setup.wrapped.device_ids) or 1) if cfg.distributed == "dp" else None
    work = None if cfg.detection else flops.training_flops_per_image(  # detectors take lists of images
        lambda: models.build(cfg.model, num_classes=class_count(cfg.data, cfg.data_dir), image_size=cfg.image_size),
        cfg.image_size)
    peak = flops.peak_tflops(devices.device_name(device), cfg.amp)
    watched = monitor_summary(monitor) if monitor is not None else None
    return {
        "images_per_second": rate,
        "warmup_steps": skip,
        "first_epoch_seconds": epoch_records[0]["seconds"],
        "epoch_seconds": [r["seconds"] for r in epoch_records],
        "first_iteration_seconds": times.seconds[:5],
        "steady_iteration_seconds": steady_median(times.seconds, skip),
        "steps": steps,
        "steps_per_epoch": plan.steps_per_epoch,
        "final_train_loss": last["train_loss"],
        **{name: last.get(name) for name in ("test_loss", "test_top1", "test_top5")},
        **{name: last[name] for name in METRICS if name in last},  # a detector's box AP
        # Seconds per iteration as Detectron2 reports them: the median step, every rank's images together.
        "seconds_per_iteration": max((r["steady_iteration_seconds"] for r in ranks
                                      if r["steady_iteration_seconds"] is not None), default=None),
        "world_size": world,
        "distributed": cfg.distributed,
        "data_parallel_devices": dp_devices,
        "global_batch_size": setup.images_per_step * world,
        "per_rank": ranks,
        "device": devices.device_name(device),
        "device_type": device.type,
        "parameters": models.count_parameters(setup.model),
        "training_flops_per_image": work,
        # Achieved FLOP/s over the devices' dense peak for this precision; None where the peak or the work is not known.
        "mfu": work and flops.mfu(rate, work, devices.device_name(device), cfg.amp, devices=dp_devices or world),
        "peak_tflops": peak[0] if peak else None,
        "peak_source": peak[1] if peak else None,
        "train_samples": plan.steps_per_epoch * setup.images_per_step * world,
        "torch_version": torch.__version__,
        "out": cfg.out,
        "trace": cfg.trace,
        "peak_memory_allocated_mib": devices.peak_memory_mib(device),
        # DataParallel fills several GPUs from one process: GPU 0 holds more (outputs, gathered gradients).
        "peak_memory_per_gpu_mib": ([devices.peak_memory_mib(torch.device("cuda", i))
                                     for i in range(torch.cuda.device_count())] if device.type == "cuda" else None),
        "monitor": watched,
        "joules_per_image": joules_per_image(watched, times),
        "resumed_from": resumed_from,
        "config": asdict(cfg),
    }
