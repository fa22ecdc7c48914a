"""What a run reports when it ends: its steady-state throughput, timings, scores and memory, per rank
and for the whole job (notebooks 01-08 read it from ``summary.json``).
"""

from __future__ import annotations

import math
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
from course_utils.parallel.process_group import node_name
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
    ids = getattr(setup.wrapped, "device_ids", None)  # DataParallel drives several GPUs from one process
    driven = [torch.device(device.type, index) for index in ids] if ids else [device]
    return {"rank": where.rank, "local_rank": where.local_rank, "node": node_name(), "node_rank": where.node_rank,
            "device": str(device), "pci_addresses": [devices.pci_address(each) for each in driven],
            "steps": steps, "images": sum(times.images),
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
            # On a shared node, devices no rank of this run uses are neighbours'.
            pci_address=("pci_address", "first"), this_process=("this_process", "any"))
        devices_seen = per_device.reset_index().to_dict("records")
    return {"backend": monitor.backend_name, "samples": len(frame), "interval": monitor.interval,
            "devices": devices_seen, "failure": monitor.failure}


def node_utilization(ranks: list[dict[str, Any]], watched: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Each sampled node's mean utilization while training, over the devices this run's ranks used there
    (matched by PCI address; where none matched, a CPU or a tool without addresses, the lowest index).
    ``watched``: each rank's :func:`monitor_summary`, None where the rank did not sample."""
    nodes = []
    for rank, monitor in zip(ranks, watched):
        if monitor is None or not monitor["devices"]:
            continue
        ours = {address for r in ranks if r["node_rank"] == rank["node_rank"] for address in r["pci_addresses"]}
        used = [row for row in monitor["devices"] if row["pci_address"] and row["pci_address"] in ours]
        used = used or monitor["devices"][:1]
        values = [value for value in (row["utilization_percent"] for row in used)
                  if value is not None and not math.isnan(value)]
        nodes.append({"node_rank": rank["node_rank"], "node": rank["node"], "backend": monitor["backend"],
                      "devices": [row["index"] for row in used],
                      "utilization_percent": statistics.mean(values) if values else None})
    return sorted(nodes, key=lambda node: node["node_rank"])


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


def work_and_peak(setup: Setup, rate: float, devices_used: int) -> dict[str, Any]:
    """The work of one training image, the devices' dense peak for this precision and the model FLOP
    utilization (achieved FLOP/s over that peak); None where the peak or the work is not known."""
    cfg, name = setup.cfg, devices.device_name(setup.device)
    work = None if cfg.detection else flops.training_flops_per_image(  # detectors take lists of images
        lambda: models.build(cfg.model, num_classes=class_count(cfg.data, cfg.data_dir), image_size=cfg.image_size),
        cfg.image_size)
    strict = not devices.tf32_convolutions()  # notebook 05's strict-fp32 stage is held to the fp32 peak
    peak = flops.peak_tflops(name, cfg.amp, strict)
    return {"training_flops_per_image": work,
            "mfu": work and flops.mfu(rate, work, name, cfg.amp, devices=devices_used, strict_fp32=strict),
            "peak_tflops": peak[0] if peak else None,
            "peak_source": peak[1] if peak else None}


def peak_memory(device: torch.device) -> dict[str, Any]:
    """This process's peak of allocated memory and, on CUDA, every GPU's: DataParallel fills several GPUs from
    one process, and GPU 0 holds more (outputs, gathered gradients)."""
    return {"peak_memory_allocated_mib": devices.peak_memory_mib(device),
            "peak_memory_per_gpu_mib": ([devices.peak_memory_mib(torch.device("cuda", i))
                                         for i in range(torch.cuda.device_count())] if device.type == "cuda" else None)}


def final_scores(last_epoch: dict[str, Any]) -> dict[str, Any]:
    """The last epoch's training loss and test scores: a classifier's loss and accuracy, a detector's box AP."""
    return {"final_train_loss": last_epoch["train_loss"],
            **{name: last_epoch.get(name) for name in ("test_loss", "test_top1", "test_top5")},
            **{name: last_epoch[name] for name in METRICS if name in last_epoch}}


def start_up_line(summary: dict[str, Any]) -> str:
    """This process's first step against its steady one: on a GPU the first pays the set-up (cuDNN's or MIOpen's
    kernel search, kernel compilation, the allocator's first requests), which the steady state leaves out."""
    first, steady = summary["first_iteration_seconds"], summary["steady_iteration_seconds"]
    if not first or math.isnan(steady):
        return "no step timed by this process"
    set_up = " (set-up: kernel search, compilation)" if summary["device_type"] == "cuda" else ""
    return f"first step {first[0]:.3g} s{set_up}, steady step {steady:.3g} s"


def run_summary(setup: Setup, plan: Plan, times: StepTimes, steps: int, epoch_records: list[dict[str, Any]],
                monitor: Monitor | None, resumed_from: str | None, memory: StepMemory | None
                ) -> dict[str, Any]:
    """The whole job's summary, the same on every rank (every rank takes part in gathering it)."""
    cfg, device, world = setup.cfg, setup.device, setup.where.world_size
    # Warm-up is paid by each process: after a resume, by the steps this one trained.
    skip = warmup_steps(plan.steps_per_epoch, plan.epochs, len(times.seconds))
    sampled = monitor_summary(monitor) if monitor is not None else None  # each node's first process samples
    ranks, node_monitors = zip(*gather((rank_summary(setup, times, steps, skip, memory), sampled)))
    watched = node_monitors[0]  # rank 0's node, every device it saw
    # Every rank trains its own images at the same time, but the ranks of a tensor-parallel group the same ones.
    rate = sum(r["images_per_second"] for r in ranks) / setup.layout.tensor_parallel
    dp_devices = (len(setup.wrapped.device_ids) or 1) if setup.layout.mode.all_gpus_in_one_process else None
    return {
        "images_per_second": rate,
        "warmup_steps": skip,
        "first_epoch_seconds": epoch_records[0]["seconds"],
        "epoch_seconds": [r["seconds"] for r in epoch_records],
        "first_iteration_seconds": times.seconds[:5],
        "steady_iteration_seconds": steady_median(times.seconds, skip),
        "conv_autotune": str(setup.conv_autotune),
        "steps": steps,
        "steps_per_epoch": plan.steps_per_epoch,
        **final_scores(epoch_records[-1]),
        # Seconds per iteration as Detectron2 reports them: the median step, every rank's images together.
        "seconds_per_iteration": max((r["steady_iteration_seconds"] for r in ranks
                                      if r["steady_iteration_seconds"] is not None), default=None),
        "world_size": world,
        "distributed": cfg.distributed,
        "data_parallel_devices": dp_devices,
        "global_batch_size": setup.images_per_step * setup.layout.data_ranks,
        "tensor_parallel_size": setup.layout.tensor_parallel,
        "per_rank": list(ranks),
        "device": devices.device_name(device),
        "device_type": device.type,
        "parameters": models.count_parameters(setup.model),
        **work_and_peak(setup, rate, dp_devices or world),
        "train_samples": plan.steps_per_epoch * setup.images_per_step * setup.layout.data_ranks,
        "torch_version": torch.__version__,
        "out": cfg.out,
        "trace": cfg.trace,
        **peak_memory(device),
        "monitor": watched,
        "node_utilization": node_utilization(list(ranks), list(node_monitors)),
        "joules_per_image": joules_per_image(watched, times),
        "resumed_from": resumed_from,
        "config": asdict(cfg),
    }
