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
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from course_utils import config, devices, models
from course_utils.checkpoint import save_atomic
from course_utils.data import DATA_SOURCES, LOADERS, DataSpec, Loaders, make_loaders
from course_utils.metrics import MetricsWriter
from course_utils.monitor import BACKEND_NAMES, Monitor
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
            values["out"] = str(config.runs_dir() / f"{values['model']}-{stamp}")
        return TrainConfig(**values)


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return devices.default_device()
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} asked for a GPU, but torch sees none; use --device cpu")
    return device


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices), so that a CPU run repeats exactly."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device,
             on_device: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
    """Test loss, top-1 and top-5 accuracy in percent."""
    model.eval()
    loss_sum = torch.zeros((), device=device)
    top1 = torch.zeros((), device=device)
    top5 = torch.zeros((), device=device)
    count = 0
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        logits = model(on_device(images) if on_device is not None else images)
        loss_sum += nn.functional.cross_entropy(logits, labels, reduction="sum")
        best = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hits = best == labels[:, None]
        top1 += hits[:, 0].sum()
        top5 += hits.any(dim=1).sum()
        count += len(labels)
    model.train()
    return {"test_loss": (loss_sum / count).item(), "test_top1": 100 * (top1 / count).item(),
            "test_top5": 100 * (top5 / count).item()}


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


@dataclass
class Setup:
    """Everything a run trains with, built once from a resolved :class:`TrainConfig`."""

    cfg: TrainConfig
    device: torch.device
    loaders: Loaders
    model: nn.Module  # the module itself: evaluation and checkpoints use it
    step_model: nn.Module  # what training calls: the model, or its torch.compile'd version
    optimizer: torch.optim.Optimizer
    criterion: nn.Module
    scaler: torch.amp.GradScaler
    autocast_dtype: torch.dtype | None  # None: no autocast, full fp32

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass where the run asks for it."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def prepare(cfg: TrainConfig) -> Setup:
    """Seed, pick the device, and build data, model and optimizer as ``cfg`` says."""
    cfg = cfg.resolved()
    size = config.get_size(cfg.size)
    device = _pick_device(cfg.device)
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
                           delay_seconds=cfg.input_delay_ms / 1000)
    model = models.build(cfg.model, num_classes=100, image_size=cfg.image_size).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay, fused=cfg.fused_optimizer or None)
    step_model = torch.compile(model, mode=cfg.compile) if cfg.compile else model
    # fp16 has a narrow range: small gradients underflow to zero unless the loss is scaled up first.
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    return Setup(cfg, device, loaders, model, step_model, optimizer,
                 nn.CrossEntropyLoss(), scaler, AMP_DTYPES[cfg.amp])


def train_step(setup: Setup, images: torch.Tensor, labels: torch.Tensor, ranges: Ranges) -> torch.Tensor:
    """Forward, backward and update on one batch already on the device; returns the loss."""
    with ranges("forward"), setup.autocast():
        loss = setup.criterion(setup.step_model(images), labels)
    with ranges("backward"):
        setup.optimizer.zero_grad(set_to_none=True)
        setup.scaler.scale(loss).backward()
    with ranges("optimizer_step"):
        setup.scaler.step(setup.optimizer)
        setup.scaler.update()
    return loss


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


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train as ``cfg`` says and return the summary that is also written to ``summary.json``."""
    setup = prepare(cfg)
    cfg, device, model = setup.cfg, setup.device, setup.model
    out = Path(cfg.out)
    steps_per_epoch = len(setup.loaders.train)
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    epochs_to_run = math.ceil(total_steps / steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(setup.optimizer, T_max=total_steps)

    ranges = Ranges(enabled=cfg.trace is not None, nvtx=True)
    profiler = start_trace(Path(cfg.trace), TraceSchedule().fitted(total_steps), device) if cfg.trace else None
    writer = MetricsWriter(out)
    monitor = Monitor(cfg.monitor, cfg.monitor_interval).start() if cfg.monitor else None
    clock = StepClock(device)
    step_seconds: list[float] = []
    step_images: list[int] = []
    epoch_records: list[dict[str, Any]] = []
    step = 0
    bar = tqdm(total=total_steps, desc=f"{cfg.model} on {device.type}", unit="it",
               disable=not cfg.progress, mininterval=_progress_interval(), dynamic_ncols=True)
    try:
        for epoch in range(epochs_to_run):
            model.train()
            if monitor is not None:
                monitor.phase(f"epoch {epoch + 1}")
            loss_sum = torch.zeros((), device=device)
            interval_loss, interval_steps = torch.zeros((), device=device), 0
            interval_data: list[float] = []
            interval_images: list[int] = []
            epoch_steps = 0
            epoch_start = time.perf_counter()
            clock.start()
            iterator = iter(setup.loaders.train)
            while step < total_steps:
                fetch_start = time.perf_counter()
                batch = next_batch(iterator, device, ranges, cfg.channels_last, setup.loaders.train_on_device)
                if batch is None:
                    break
                interval_data.append(time.perf_counter() - fetch_start)
                loss = train_step(setup, *batch, ranges)
                scheduler.step()
                clock.lap()
                if profiler is not None:
                    profiler.step()
                step += 1
                epoch_steps += 1
                loss_sum += loss.detach()
                interval_loss += loss.detach()
                interval_steps += 1
                interval_images.append(len(batch[1]))
                bar.update()
                last = step == total_steps or epoch_steps == steps_per_epoch
                if step % cfg.log_every == 0 or last:
                    seconds = clock.drain()
                    mean_loss = (interval_loss / interval_steps).item()
                    if not math.isfinite(mean_loss):
                        raise NonFiniteLossError(
                            f"the training loss became {mean_loss} by step {step} (epoch {epoch + 1}); "
                            f"lower --lr (now {cfg.lr}) and check the data")
                    rate = sum(interval_images) / sum(seconds)
                    writer.record(
                        {"kind": "step", "step": step, "epoch": epoch + 1, "loss": mean_loss,
                         "lr": scheduler.get_last_lr()[0], "images_per_second": rate,
                         "iteration_seconds": seconds, "data_seconds": interval_data},
                        {"train/loss": mean_loss, "train/images_per_second": rate,
                         "train/lr": scheduler.get_last_lr()[0]}, step)
                    step_seconds += seconds
                    step_images += interval_images
                    bar.set_postfix(loss=f"{mean_loss:.3f}", img_s=f"{rate:.0f}")
                    interval_loss.zero_()
                    interval_steps, interval_data, interval_images = 0, [], []
            devices.synchronize(device)
            epoch_seconds = time.perf_counter() - epoch_start
            eval_start = time.perf_counter()
            if monitor is not None:
                monitor.phase(f"eval {epoch + 1}")
            with setup.autocast():
                scores = evaluate(model, setup.loaders.test, device, setup.loaders.test_on_device)
            record = {"kind": "epoch", "epoch": epoch + 1, "step": step, "steps": epoch_steps,
                      "seconds": epoch_seconds, "eval_seconds": time.perf_counter() - eval_start,
                      "train_loss": (loss_sum / epoch_steps).item(),
                      "images_per_second": epoch_steps * cfg.batch_size / epoch_seconds, **scores}
            epoch_records.append(record)
            writer.record(record, {"epoch/seconds": epoch_seconds, "train/epoch_loss": record["train_loss"],
                                   "test/loss": scores["test_loss"], "test/top1": scores["test_top1"],
                                   "test/top5": scores["test_top5"]}, epoch + 1)
            save_atomic({"model": model.state_dict(), "optimizer": setup.optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "scaler": setup.scaler.state_dict(), "epoch": epoch + 1, "step": step,
                         "config": asdict(cfg)}, out / CHECKPOINT_PATH)
            tqdm.write(f"epoch {epoch + 1}/{epochs_to_run}: {epoch_seconds:.1f} s, train loss "
                       f"{record['train_loss']:.3f}, test top-1 {scores['test_top1']:.1f} %, "
                       f"{record['images_per_second']:.0f} images/s")
    finally:
        bar.close()
        writer.close()
        setup.loaders.close()
        if profiler is not None:
            profiler.stop()
        if monitor is not None:
            monitor.stop()
            monitor.frame().to_csv(out / MONITOR_FILE, index=False)

    skip = warmup_steps(steps_per_epoch, epochs_to_run, step)
    summary = {
        "images_per_second": images_per_second(step_seconds, step_images, skip),
        "warmup_steps": skip,
        "first_epoch_seconds": epoch_records[0]["seconds"],
        "epoch_seconds": [r["seconds"] for r in epoch_records],
        "first_iteration_seconds": step_seconds[:5],
        "steady_iteration_seconds": statistics.median(step_seconds[skip:] or step_seconds),
        "steps": step,
        "steps_per_epoch": steps_per_epoch,
        "final_train_loss": epoch_records[-1]["train_loss"],
        "test_loss": epoch_records[-1]["test_loss"],
        "test_top1": epoch_records[-1]["test_top1"],
        "test_top5": epoch_records[-1]["test_top5"],
        "world_size": 1,
        "device": device_name(device),
        "device_type": device.type,
        "parameters": models.count_parameters(model),
        "train_samples": steps_per_epoch * cfg.batch_size,
        "torch_version": torch.__version__,
        "out": str(out),
        "trace": cfg.trace,
        "peak_memory_allocated_mib": (torch.cuda.max_memory_allocated(device) / 2**20
                                      if device.type == "cuda" else None),
        "monitor": _monitor_summary(monitor) if monitor is not None else None,
        "config": asdict(cfg),
    }
    writer.summary(summary)
    return summary


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
    add("--out", help="run folder for metrics, TensorBoard and checkpoints (default: runs/<model>-<time>)")
    add("--log-every", type=int, help="write a metrics record every N iterations (default: from the size)")
    add("--device", default="auto", help="auto (first GPU, else CPU), cpu, cuda or cuda:N")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar (batch jobs)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run(TrainConfig(**vars(args)))
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{summary['images_per_second']:.0f} images/s in steady state, test top-1 "
          f"{summary['test_top1']:.1f} %; results in {summary['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
