"""The one training loop of the course and its command line, ``python -m course_utils.train``.

Notebooks call :func:`train` with the same arguments as the flags (``--batch-size`` becomes
``batch_size=``), job scripts and benchmarks call the command; both end in :func:`run`. A run
writes ``metrics.jsonl``, ``summary.json``, TensorBoard events and ``checkpoints/last.pt`` under
its ``--out`` folder. Flags left unset take their value from the course size (``--size`` or
``COURSE_SIZE``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from course_utils import config, devices, distributed, models, parallel
from course_utils.checkpoint import save_atomic
from course_utils.data import DATA_SOURCES, LOADERS, DataSpec, Loaders, make_loaders
from course_utils.metrics import MetricsWriter
from course_utils.monitor import BACKEND_NAMES, Monitor
from course_utils.parallel import PARALLEL_MODES, DDPOptions
from course_utils.profiling import Ranges, TraceSchedule, start_trace
from course_utils.timing import StepClock, images_per_second, warmup_steps

CHECKPOINT_PATH = Path("checkpoints") / "last.pt"
AMP_DTYPES: dict[str, torch.dtype | None] = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
MONITOR_FILE = "monitor.csv"


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the message names the step."""


@dataclass
class TrainConfig:
    """Every setting of a run. ``None`` means: take it from the course size."""

    size: str | None = None
    model: str | None = None
    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 5e-4
    workers: int | None = None
    loader: str = "torch"
    pin_memory: bool | None = None
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    seed: int = 0
    data: str = "cifar100"
    data_dir: str | None = None
    augment: bool = True
    image_size: int | None = None
    train_samples: int | None = None
    test_samples: int | None = None
    input_delay_ms: float = 0.0
    out: str | None = None
    log_every: int | None = None
    amp: str = "off"
    channels_last: bool = False
    fused_optimizer: bool = False
    compile: str | None = None
    trace: str | None = None
    monitor: str | None = None
    monitor_interval: float = 0.5
    device: str = "auto"
    progress: bool = True
    distributed: str = "none"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    sync_bn: bool = False
    grad_accum: int = 1
    warmup_epochs: float = 0.0
    dist_timeout: float = 600.0

    def resolved(self) -> TrainConfig:
        """A copy with every size-dependent ``None`` filled in and the paths made concrete."""
        size = config.get_size(self.size)
        values = asdict(self)
        values["size"] = size.name
        for name in ("model", "epochs", "batch_size", "lr", "workers", "log_every", "image_size"):
            if values[name] is None:
                values[name] = getattr(size, name)
        if self.data == "cifar100":
            for name in ("train_samples", "test_samples"):
                if values[name] is None:
                    values[name] = getattr(size, name)
            values["data_dir"] = str(self.data_dir or config.data_dir(size))
        if values["out"] is None:
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            values["out"] = config.runs_dir() / f"{values['model']}-{stamp}"
        for name in ("out", "data_dir", "trace"):  # paths may come as Path objects from a notebook
            if values[name] is not None:
                values[name] = str(values[name])
        return TrainConfig(**values)


def _pick_device(name: str, where: distributed.Placement) -> torch.device:
    if name == "auto":
        device = devices.default_device()
        # One GPU per local rank: distributed.setup has made it the current one.
        return torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" and where.distributed \
            else device
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} asked for a GPU, but torch sees none; use --device cpu")
    return device


def _join(cfg: TrainConfig) -> distributed.Placement:
    """Join the process group for DDP; refuse a launch under torchrun/srun that would train N copies alone."""
    if cfg.distributed == "ddp":
        return distributed.setup(cfg.dist_timeout, alone=True)
    where = distributed.placement()
    if where.distributed:
        raise ValueError(f"this process is rank {where.rank} of {where.world_size} ({where.source}), but "
                         f"--distributed is {cfg.distributed}: every rank would train alone; add --distributed ddp")
    if cfg.sync_bn:
        raise ValueError("--sync-bn synchronises BatchNorm over DDP ranks; use it with --distributed ddp")
    return where


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices), so that a CPU run repeats exactly."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device,
             on_device: Callable[[torch.Tensor], torch.Tensor] | None = None,
             sharded: bool = False) -> dict[str, float]:
    """Test loss, top-1 and top-5 accuracy in percent; with ``sharded`` each rank scores its share
    and the sums are added over the ranks, so every rank returns the scores of the whole test set."""
    model.eval()
    sums = torch.zeros(4, device=device)  # loss, top-1 hits, top-5 hits, images
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        logits = model(on_device(images) if on_device is not None else images)
        best = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hits = best == labels[:, None]
        sums += torch.stack([nn.functional.cross_entropy(logits.float(), labels, reduction="sum"),
                             hits[:, 0].sum(), hits.any(dim=1).sum(), torch.tensor(len(labels), device=device)])
    model.train()
    if sharded:
        parallel.sum_over_ranks(sums)
    loss, top1, top5, count = sums.tolist()
    return {"test_loss": loss / count, "test_top1": 100 * top1 / count, "test_top5": 100 * top5 / count}


def _progress_interval() -> float:
    """Redraw often on a terminal or in a notebook; in a log file (batch jobs, CI) every 30 s."""
    in_notebook = "ipykernel" in sys.modules
    return 0.1 if in_notebook or sys.stderr.isatty() else 30.0


def _monitor_summary(monitor: Monitor) -> dict[str, Any]:
    """Means and peaks over the training phases (evaluation left out), per device."""
    frame = monitor.frame()
    training = frame[frame["phase"].str.startswith("epoch")]
    per_device = training.groupby("index").agg(
        utilization_percent=("utilization_percent", "mean"), memory_peak_mib=("memory_used_mib", "max"),
        power_watts=("power_watts", "mean"), power_limit_watts=("power_limit_watts", "max"))
    return {"backend": monitor.backend_name, "samples": len(frame), "interval": monitor.interval,
            "devices": per_device.reset_index().to_dict("records")}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def _peak_memory_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def lr_schedule(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """The factor on the peak learning rate at each step: a linear warm-up over ``warmup_steps``
    (large global batches diverge without one), then a cosine down to zero."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


@dataclass
class Setup:
    """Everything a run trains with, built once from a resolved :class:`TrainConfig`."""

    cfg: TrainConfig
    where: distributed.Placement
    device: torch.device
    loaders: Loaders
    model: nn.Module  # the module itself: evaluation and checkpoints use it
    wrapped: nn.Module  # the model, or its DataParallel / DDP wrapper
    step_model: nn.Module  # what training calls: ``wrapped``, or its torch.compile'd version
    optimizer: torch.optim.Optimizer
    criterion: nn.Module
    scaler: torch.amp.GradScaler
    autocast_dtype: torch.dtype | None  # None: no autocast, full fp32

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass where the run asks for it."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @property
    def images_per_step(self) -> int:
        """Images one optimizer step of this process consumes."""
        return self.cfg.batch_size * self.cfg.grad_accum


def prepare(cfg: TrainConfig) -> Setup:
    """Join the process group if DDP, seed, pick the device, and build data, model and optimizer."""
    cfg = cfg.resolved()
    if cfg.grad_accum < 1:
        raise ValueError(f"--grad-accum must be at least 1, not {cfg.grad_accum}")
    where = _join(cfg)
    try:
        return _build(cfg, where)
    except BaseException:
        distributed.teardown()
        raise


def _build(cfg: TrainConfig, where: distributed.Placement) -> Setup:
    size = config.get_size(cfg.size)
    device = _pick_device(cfg.device, where)
    # The same seed on every rank: the replicas start equal (DDP also broadcasts rank 0's weights).
    seed_everything(cfg.seed)
    if device.type == "cuda":
        # Let cuDNN (MIOpen on ROCm) search for the fastest kernels: costly in the first iterations.
        torch.backends.cudnn.benchmark = True
    spec = DataSpec(source=cfg.data, root=Path(cfg.data_dir) if cfg.data_dir else None,
                    image_size=cfg.image_size, augment=cfg.augment, train_samples=cfg.train_samples,
                    test_samples=cfg.test_samples, seed=cfg.seed,
                    prepare_hint=config.prepare_command(size, cfg.data_dir))
    pin_memory = device.type == "cuda" if cfg.pin_memory is None else cfg.pin_memory
    loaders = make_loaders(cfg.loader, spec, cfg.batch_size, device, workers=cfg.workers, pin_memory=pin_memory,
                           persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor,
                           delay_seconds=cfg.input_delay_ms / 1000, shard_id=where.rank,
                           num_shards=where.world_size)
    model = models.build(cfg.model, num_classes=100, image_size=cfg.image_size).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    wrapped = parallel.wrap(model, cfg.distributed, device, DDPOptions(
        cfg.bucket_cap_mb, cfg.gradient_as_bucket_view, cfg.static_graph, cfg.sync_bn))
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay, fused=cfg.fused_optimizer or None)
    step_model = torch.compile(wrapped, mode=cfg.compile) if cfg.compile else wrapped
    # fp16 has a narrow range: small gradients underflow to zero unless the loss is scaled up first.
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    return Setup(cfg, where, device, loaders, model, wrapped, step_model, optimizer,
                 nn.CrossEntropyLoss(), scaler, AMP_DTYPES[cfg.amp])


def train_step(setup: Setup, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], ranges: Ranges) -> torch.Tensor:
    """One optimizer step over ``batches`` (micro-batches already on the device, their gradients
    accumulated; under DDP only the last one is all-reduced); returns the mean loss."""
    setup.optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=setup.device)
    for index, (images, labels) in enumerate(batches):
        with parallel.no_sync(setup.wrapped, sync=index == len(batches) - 1):
            with ranges("forward"), setup.autocast():
                loss = setup.criterion(setup.step_model(images), labels) / len(batches)
            with ranges("backward"):
                setup.scaler.scale(loss).backward()
        total += loss.detach()
    with ranges("optimizer_step"):
        setup.scaler.step(setup.optimizer)
        setup.scaler.update()
    return total


def next_batch(iterator: Iterator, device: torch.device, ranges: Ranges, channels_last: bool = False,
               on_device: Callable[[torch.Tensor], torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The next batch on ``device``, through ``on_device`` (augmentation there) if given; None at
    the end of the epoch."""
    with ranges("data"):
        try:
            images, labels = next(iterator)
        except StopIteration:
            return None
        images = images.to(device, non_blocking=True)
        if on_device is not None:
            images = on_device(images)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels.to(device, non_blocking=True)


def _next_step_batches(iterator: Iterator, setup: Setup, ranges: Ranges) -> list | None:
    """The ``grad_accum`` micro-batches of the next step, or None when the epoch has fewer left."""
    batches = []
    for _ in range(setup.cfg.grad_accum):
        batch = next_batch(iterator, setup.device, ranges, setup.cfg.channels_last, setup.loaders.train_on_device)
        if batch is None:
            return None
        batches.append(batch)
    return batches


class _Loop:
    """The state of one run between its epochs: counters, clocks, writers and observers."""

    def __init__(self, setup: Setup) -> None:
        cfg = setup.cfg
        self.setup, self.cfg = setup, cfg
        self.main = setup.where.is_main  # rank 0 writes metrics, TensorBoard and checkpoints
        self.out = Path(cfg.out)
        self.steps_per_epoch = len(setup.loaders.train) // cfg.grad_accum
        if self.steps_per_epoch == 0:
            raise ValueError(f"--grad-accum {cfg.grad_accum} needs more batches than one epoch has "
                             f"({len(setup.loaders.train)}); lower it or use more samples")
        self.total_steps = self.steps_per_epoch * cfg.epochs
        if cfg.max_steps is not None:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        warmup = round(cfg.warmup_epochs * self.steps_per_epoch)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(setup.optimizer, lr_schedule(self.total_steps, warmup))
        self.ranges = Ranges(enabled=cfg.trace is not None, nvtx=True)
        self.profiler = (start_trace(Path(cfg.trace), TraceSchedule().fitted(self.total_steps), setup.device)
                         if cfg.trace and self.main else None)
        self.writer = MetricsWriter(self.out, enabled=self.main)
        self.monitor = Monitor(cfg.monitor, cfg.monitor_interval).start() if cfg.monitor and self.main else None
        self.clock = StepClock(setup.device)
        self.step = 0
        self.step_seconds: list[float] = []
        self.step_images: list[int] = []
        self.data_seconds: list[float] = []
        self.epoch_records: list[dict[str, Any]] = []
        self.bar = tqdm(total=self.total_steps, desc=f"{cfg.model} on {setup.device.type}", unit="it",
                        disable=not (cfg.progress and self.main), mininterval=_progress_interval(),
                        dynamic_ncols=True)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()
        if self.profiler is not None:
            self.profiler.stop()
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor.frame().to_csv(self.out / MONITOR_FILE, index=False)

    def run_epoch(self, epoch: int) -> None:
        setup, cfg, device = self.setup, self.cfg, self.setup.device
        setup.model.train()
        setup.loaders.set_epoch(epoch)
        if self.monitor is not None:
            self.monitor.phase(f"epoch {epoch + 1}")
        loss_sum = torch.zeros((), device=device)
        interval_loss, interval_data, interval_images = torch.zeros((), device=device), [], []
        epoch_steps = 0
        epoch_start = time.perf_counter()
        self.clock.start()
        iterator = iter(setup.loaders.train)
        while self.step < self.total_steps and epoch_steps < self.steps_per_epoch:
            fetch_start = time.perf_counter()
            batches = _next_step_batches(iterator, setup, self.ranges)
            if batches is None:
                break
            interval_data.append(time.perf_counter() - fetch_start)
            loss = train_step(setup, batches, self.ranges)
            self.scheduler.step()
            self.clock.lap()
            if self.profiler is not None:
                self.profiler.step()
            self.step += 1
            epoch_steps += 1
            loss_sum += loss
            interval_loss += loss
            interval_images.append(sum(len(labels) for _, labels in batches))
            self.bar.update()
            if self.step % cfg.log_every == 0 or self.step == self.total_steps or epoch_steps == self.steps_per_epoch:
                self._log(epoch, interval_loss / len(interval_images), interval_data, interval_images)
                interval_loss.zero_()
                interval_data, interval_images = [], []
        devices.synchronize(device)
        epoch_seconds = time.perf_counter() - epoch_start
        self._end_epoch(epoch, epoch_steps, epoch_seconds, parallel.mean_over_ranks(loss_sum / epoch_steps).item())

    def _log(self, epoch: int, loss: torch.Tensor, data_seconds: list[float], images: list[int]) -> None:
        seconds = self.clock.drain()
        mean_loss = parallel.mean_over_ranks(loss).item()
        if not math.isfinite(mean_loss):
            raise NonFiniteLossError(
                f"the training loss became {mean_loss} by step {self.step} (epoch {epoch + 1}); "
                f"lower --lr (now {self.cfg.lr}) and check the data")
        rate = sum(images) / sum(seconds)
        lr = self.scheduler.get_last_lr()[0]
        self.writer.record(
            {"kind": "step", "step": self.step, "epoch": epoch + 1, "loss": mean_loss, "lr": lr,
             "images_per_second": rate, "iteration_seconds": seconds, "data_seconds": data_seconds},
            {"train/loss": mean_loss, "train/images_per_second": rate, "train/lr": lr}, self.step)
        self.step_seconds += seconds
        self.step_images += images
        self.data_seconds += data_seconds
        self.bar.set_postfix(loss=f"{mean_loss:.3f}", img_s=f"{rate:.0f}")

    def _end_epoch(self, epoch: int, epoch_steps: int, epoch_seconds: float, train_loss: float) -> None:
        setup = self.setup
        eval_start = time.perf_counter()
        if self.monitor is not None:
            self.monitor.phase(f"eval {epoch + 1}")
        with setup.autocast():
            scores = evaluate(setup.model, setup.loaders.test, setup.device, setup.loaders.test_on_device,
                              setup.loaders.test_sharded)
        ranks = parallel.gather({"rank": setup.where.rank, "steps": epoch_steps, "seconds": epoch_seconds})
        world = setup.where.world_size
        record = {"kind": "epoch", "epoch": epoch + 1, "step": self.step, "steps": epoch_steps,
                  "seconds": epoch_seconds, "eval_seconds": time.perf_counter() - eval_start,
                  "train_loss": train_loss,
                  "images_per_second": epoch_steps * setup.images_per_step * world / epoch_seconds,
                  "ranks": ranks, **scores}
        self.epoch_records.append(record)
        self.writer.record(record, {"epoch/seconds": epoch_seconds, "train/epoch_loss": train_loss,
                                    "test/loss": scores["test_loss"], "test/top1": scores["test_top1"],
                                    "test/top5": scores["test_top5"]}, epoch + 1)
        if self.main:
            save_atomic({"model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
                         "scheduler": self.scheduler.state_dict(), "scaler": setup.scaler.state_dict(),
                         "epoch": epoch + 1, "step": self.step, "config": asdict(self.cfg)},
                        self.out / CHECKPOINT_PATH)
            tqdm.write(f"epoch {epoch + 1}/{self.epochs}: {epoch_seconds:.1f} s, train loss {train_loss:.3f}, "
                       f"test top-1 {scores['test_top1']:.1f} %, {record['images_per_second']:.0f} images/s")

    def rank_summary(self, skip: int) -> dict[str, Any]:
        """This rank's own share: its iteration count and timings."""
        where, device = self.setup.where, self.setup.device
        # Under Slurm the node's name, which differs from the host name where nodes are virtual.
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        return {"rank": where.rank, "local_rank": where.local_rank, "node": node,
                "device": str(device), "steps": self.step, "images": sum(self.step_images),
                "images_per_second": images_per_second(self.step_seconds, self.step_images, skip),
                "steady_iteration_seconds": statistics.median(self.step_seconds[skip:] or self.step_seconds),
                "data_seconds_median": statistics.median(self.data_seconds) if self.data_seconds else None,
                "peak_memory_mib": _peak_memory_mib(device)}

    def summary(self) -> dict[str, Any]:
        setup, cfg, device = self.setup, self.cfg, self.setup.device
        skip = warmup_steps(self.steps_per_epoch, self.epochs, self.step)
        ranks = parallel.gather(self.rank_summary(skip))
        last = self.epoch_records[-1]
        world = setup.where.world_size
        return {
            # Every rank trains on its own images at the same time: the job's rate is the sum.
            "images_per_second": sum(r["images_per_second"] for r in ranks),
            "warmup_steps": skip,
            "first_epoch_seconds": self.epoch_records[0]["seconds"],
            "epoch_seconds": [r["seconds"] for r in self.epoch_records],
            "first_iteration_seconds": self.step_seconds[:5],
            "steady_iteration_seconds": statistics.median(self.step_seconds[skip:] or self.step_seconds),
            "steps": self.step,
            "steps_per_epoch": self.steps_per_epoch,
            "final_train_loss": last["train_loss"],
            "test_loss": last["test_loss"],
            "test_top1": last["test_top1"],
            "test_top5": last["test_top5"],
            "world_size": world,
            "distributed": cfg.distributed,
            "data_parallel_devices": (len(setup.wrapped.device_ids) or 1) if cfg.distributed == "dp" else None,
            "global_batch_size": setup.images_per_step * world,
            "per_rank": ranks,
            "device": device_name(device),
            "device_type": device.type,
            "parameters": models.count_parameters(setup.model),
            "train_samples": self.steps_per_epoch * setup.images_per_step * world,
            "torch_version": torch.__version__,
            "out": str(self.out),
            "trace": cfg.trace,
            "peak_memory_allocated_mib": _peak_memory_mib(device),
            # DataParallel fills several GPUs from one process: GPU 0 holds more (outputs, gathered gradients).
            "peak_memory_per_gpu_mib": ([_peak_memory_mib(torch.device("cuda", i))
                                         for i in range(torch.cuda.device_count())] if device.type == "cuda" else None),
            "monitor": _monitor_summary(self.monitor) if self.monitor is not None else None,
            "config": asdict(cfg),
        }


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train as ``cfg`` says and return the summary that rank 0 also writes to ``summary.json``."""
    setup = prepare(cfg)
    try:
        loop = _Loop(setup)
        try:
            for epoch in range(loop.epochs):
                loop.run_epoch(epoch)
        finally:
            loop.close()
        summary = loop.summary()
        loop.writer.summary(summary)
        return summary
    finally:
        setup.loaders.close()
        distributed.teardown()


def train(**options: Any) -> dict[str, Any]:
    """Train from a notebook: ``train(model="resnet18", epochs=2)`` is ``--model resnet18 --epochs 2``."""
    valid = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")
    return run(TrainConfig(**options))


def build_parser() -> argparse.ArgumentParser:
    sizes = ", ".join(f"{name}: {s.model}, {s.epochs} epochs, batch {s.batch_size}"
                      for name, s in config.SIZES.items())
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.train", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Size defaults: {sizes}.")
    add = parser.add_argument
    add("--size", choices=list(config.SIZES), help=f"course size (default: ${config.SIZE_VARIABLE}, "
        "else workshop on a GPU machine and ci elsewhere); fills every flag left unset")
    add("--model", choices=models.MODEL_NAMES, help="network to train (default: from the size)")
    add("--epochs", type=int, help="passes over the training set (default: from the size)")
    add("--max-steps", type=int, help="stop after this many iterations in all, even mid-epoch")
    add("--batch-size", type=int, help="images per iteration and process (default: from the size)")
    add("--lr", type=float, help="peak learning rate of SGD, annealed by a cosine (default: from the size)")
    add("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    add("--weight-decay", type=float, default=5e-4, help="L2 weight decay (default 5e-4)")
    add("--workers", type=int, help="DataLoader worker processes (default: from the size)")
    add("--loader", choices=LOADERS, default="torch",
        help="torch: augment in DataLoader workers (default); dali: an NVIDIA DALI pipeline (GPU operators on "
             "NVIDIA, CPU operators elsewhere); gpu-aug: uint8 batches augmented on the device (the AMD path)")
    add("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
        help="page-locked host batches for faster copies to the GPU (default: on with a GPU)")
    add("--persistent-workers", action="store_true", help="keep DataLoader workers alive between epochs")
    add("--prefetch-factor", type=int, help="batches each worker loads ahead (PyTorch's default: 2)")
    add("--seed", type=int, default=0, help="random seed; a CPU run with the same seed repeats exactly")
    add("--data", choices=DATA_SOURCES, default="cifar100",
        help="cifar100 (default), synthetic random images (no I/O), or an imagefolder with train/ and val/")
    add("--data-dir", help="data root holding cifar-100-python/ (default: from the size and $COURSE_DATA_DIR)")
    add("--no-augment", dest="augment", action="store_false", help="turn off random crop and flip")
    add("--image-size", type=int, choices=(32, 224),
        help="32: native CIFAR with CIFAR-stem ResNets; 224: resized, torchvision's standard ResNets "
             "(the LUMI workshop's set-up)")
    add("--train-samples", type=int, help="use only the first N training images")
    add("--test-samples", type=int, help="use only the first N test images")
    add("--amp", choices=list(AMP_DTYPES), default="off",
        help="mixed precision: autocast to fp16 (with loss scaling) or bf16; off trains in fp32 (default)")
    add("--channels-last", action="store_true", help="NHWC memory layout for model and images (faster convolutions "
        "on tensor cores)")
    add("--fused-optimizer", action="store_true", help="one fused kernel for the whole SGD update")
    add("--compile", choices=COMPILE_MODES, help="torch.compile the model in this mode; reduce-overhead adds "
        "CUDA graphs on GPUs")
    add("--input-delay-ms", type=float, default=0.0,
        help="sleep this long in the loader for every batch, in its workers: an input-bound run on purpose "
             "(torch and gpu-aug loaders; default 0)")
    add("--trace", metavar="DIR", help="profile a few iterations with torch.profiler; write DIR/trace.json "
        "(open it in Perfetto), a TensorBoard trace and operator/phase tables")
    add("--monitor", nargs="?", const="auto", choices=BACKEND_NAMES, metavar="BACKEND",
        help="sample GPU (or CPU) utilization, memory and power during the run into OUT/monitor.csv; "
             f"BACKEND is one of {', '.join(BACKEND_NAMES)} (default auto)")
    add("--monitor-interval", type=float, default=0.5, help="seconds between monitor samples (default 0.5)")
    add("--distributed", choices=PARALLEL_MODES, default="none",
        help="none: one device (default); dp: nn.DataParallel over the visible GPUs in this process; ddp: "
             "DistributedDataParallel, one process per device (start it with torchrun or srun; alone it makes a "
             "group of one)")
    add("--bucket-cap-mb", type=float, default=25.0, help="DDP: size of the gradient buckets all-reduced together "
        "(default 25)")
    add("--gradient-as-bucket-view", action="store_true", help="DDP: gradients live inside the communication "
        "buckets, saving a copy and memory")
    add("--static-graph", action="store_true", help="DDP: the graph is the same every step, so DDP plans its "
        "communication once")
    add("--sync-bn", action="store_true", help="DDP on GPUs: BatchNorm statistics over the global batch "
        "(SyncBatchNorm)")
    add("--grad-accum", type=int, default=1, metavar="N", help="accumulate gradients over N batches per optimizer "
        "step (DDP all-reduces only the last one, under no_sync for the others)")
    add("--warmup-epochs", type=float, default=0.0, help="raise the learning rate linearly from ~0 to --lr over "
        "this many epochs, then anneal (large global batches need it; default 0)")
    add("--dist-timeout", type=float, default=600.0, help="seconds a rank waits for the others before it fails "
        "instead of hanging (default 600)")
    add("--out", help="run folder for metrics, TensorBoard and checkpoints (default: runs/<model>-<time>)")
    add("--log-every", type=int, help="write a metrics record every N iterations (default: from the size)")
    add("--device", default="auto", help="auto (first GPU, else CPU), cpu, cuda or cuda:N")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar (batch jobs)")
    return parser


def to_flags(**options: Any) -> list[str]:
    """The command-line flags that mean ``options`` (``batch_size=32, augment=False`` gives
    ``--batch-size 32 --no-augment``): what a notebook passes to torchrun or a job script."""
    actions = {action.dest: action for action in build_parser()._actions if action.option_strings}
    flags: list[str] = []
    for name, value in options.items():
        if name not in actions:
            raise TypeError(f"unknown option {name!r}; valid: {', '.join(sorted(actions))}")
        action = actions[name]
        if isinstance(action, argparse.BooleanOptionalAction):
            flags.append(action.option_strings[0] if value else action.option_strings[1])
        elif action.nargs == 0:  # store_true / store_false: the flag says the non-default value
            if bool(value) != bool(action.default):
                flags.append(action.option_strings[0])
        elif value is not None:
            flags += [action.option_strings[0], str(value)]
    return flags


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run(TrainConfig(**vars(args)))
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if distributed.placement().is_main:
        print(f"{summary['images_per_second']:.0f} images/s in steady state, test top-1 "
              f"{summary['test_top1']:.1f} %; results in {summary['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
