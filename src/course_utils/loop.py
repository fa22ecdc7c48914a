"""The loop over epochs of one run: logging, evaluation, checkpoints, observers and the summary.

Every rank runs it; rank 0 alone writes metrics, TensorBoard events, checkpoints and the summary.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from course_utils import devices, models, parallel, preemption
from course_utils import checkpoint, resume
from course_utils.preemption import Preempted, StopSignals
from course_utils.metrics import MetricsWriter
from course_utils.monitor import Monitor
from course_utils.profiling import Ranges, TraceSchedule, start_trace
from course_utils.step import Setup, device_name, evaluate, next_step_batches, train_step
from course_utils.timing import StepClock, images_per_second, warmup_steps

CHECKPOINT_DIR = "checkpoints"
MONITOR_FILE = "monitor.csv"


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the message names the step."""


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


class Loop:
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
        self.clock = StepClock(setup.device)
        self.step = 0
        self.start_epoch, self.start_epoch_step, self.start_loss_sum = 0, 0, 0.0
        self.resumed_from: str | None = None
        self.rank_state: dict[str, Any] | None = None  # this rank's generators from the checkpoint
        if cfg.resume:
            self._resume(cfg.resume)
        if self.main:
            preemption.clear(self.out)
            checkpoint.remove_partial(self.out / CHECKPOINT_DIR)
            if not self.resumed_from and checkpoint.remove_all(self.out / CHECKPOINT_DIR):
                # A new run in a folder replaces the old one, as its metrics do; --resume continues it instead.
                tqdm.write(f"a new run in {self.out}: the earlier run's checkpoints were removed")
        self.writer = MetricsWriter(self.out, enabled=self.main,
                                    resume_step=self.step if self.resumed_from else None)
        self.epoch_records: list[dict[str, Any]] = [r for r in self.writer.kept if r.get("kind") == "epoch"]
        self.monitor = Monitor(cfg.monitor, cfg.monitor_interval).start() if cfg.monitor and self.main else None
        self.step_seconds: list[float] = []
        self.step_images: list[int] = []
        self.data_seconds: list[float] = []
        self.loader_state: torch.Tensor | None = None  # the DataLoader's generator before this epoch's iter()
        self.bar = tqdm(total=self.total_steps, initial=self.step, desc=f"{cfg.model} on {setup.device.type}",
                        unit="it", disable=not (cfg.progress and self.main), mininterval=_progress_interval(),
                        dynamic_ncols=True)
        self.signals = StopSignals().__enter__()

    def _resume(self, resume_option: str) -> None:
        """Load the checkpoint ``--resume`` names into model, optimizer, scheduler and counters."""
        setup = self.setup
        path = resume.find(resume_option, self.out / CHECKPOINT_DIR)
        if path is None:
            if self.main:
                tqdm.write(f"no checkpoint in {self.out / CHECKPOINT_DIR} yet: starting from the beginning")
            return
        state = checkpoint.load(path, map_location=setup.device)
        resume.check_same_training(state["config"], asdict(self.cfg), setup.where.world_size, state["world_size"],
                                   path)
        setup.model.load_state_dict(state["model"])
        setup.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        setup.scaler.load_state_dict(state["scaler"])
        self.step, self.start_epoch, self.start_epoch_step = state["step"], state["epoch"], state["epoch_step"]
        self.start_loss_sum = state["epoch_loss_sum"]
        self.rank_state = state["ranks"][setup.where.rank]
        self.resumed_from = str(path)
        if self.main:
            tqdm.write(f"resuming from {path}: step {self.step}, epoch {self.start_epoch + 1}, "
                       f"{self.start_epoch_step} steps into it")

    def _save(self, epoch: int, epoch_step: int, epoch_loss_sum: torch.Tensor) -> None:
        """A checkpoint from which :meth:`_resume` continues exactly: rank 0 writes every rank's generators."""
        setup = self.setup
        loss = parallel.mean_over_ranks(epoch_loss_sum.detach().clone()).item()
        weights_finite = all(torch.isfinite(value).all() for value in setup.model.state_dict().values()
                             if value.is_floating_point())
        if not (math.isfinite(loss) and weights_finite):  # never replace a good checkpoint with a diverged one
            what = f"the training loss became {loss}" if not math.isfinite(loss) else "the weights became inf or nan"
            raise NonFiniteLossError(f"{what} by step {self.step} (epoch {epoch + 1}); lower --lr (now {self.cfg.lr}); "
                                     f"the last good checkpoint is kept")
        loader = getattr(setup.loaders.train, "generator", None)
        augment = getattr(setup.loaders.train_on_device, "generator", None)
        ranks = parallel.gather({
            "rng": resume.rng_state(),
            # Mid-epoch: the state before this epoch's iter(); at an epoch's end: the state now.
            "loader": self.loader_state if epoch_step else resume.generator_state(loader),
            "augment": resume.generator_state(augment)})
        if self.main:
            checkpoint.save_keeping(
                {"model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "scaler": setup.scaler.state_dict(),
                 "epoch": epoch, "epoch_step": epoch_step, "step": self.step,
                 "epoch_loss_sum": epoch_loss_sum.item(), "world_size": setup.where.world_size,
                 "config": asdict(self.cfg), "ranks": ranks},
                self.out / CHECKPOINT_DIR, self.step, self.cfg.keep_checkpoints)

    def _stop_requested(self, at_log_point: bool) -> bool:
        """Whether SIGTERM/SIGUSR1 arrived; under DDP the ranks agree at log points, so all stop at one step."""
        received = self.signals.received is not None
        if self.setup.where.world_size == 1:
            return received
        return at_log_point and parallel.any_rank(received, self.setup.device)

    def close(self) -> None:
        self.signals.__exit__()
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
        resuming = self.rank_state is not None and epoch == self.start_epoch
        epoch_steps = self.start_epoch_step if resuming else 0
        loss_sum = torch.full((), self.start_loss_sum if resuming else 0.0, device=device)
        loader_generator = getattr(setup.loaders.train, "generator", None)
        if resuming and self.rank_state["loader"] is not None:
            loader_generator.set_state(self.rank_state["loader"])
        self.loader_state = resume.generator_state(loader_generator)
        interval_loss, interval_data, interval_images = torch.zeros((), device=device), [], []
        epoch_start = time.perf_counter()
        iterator = iter(setup.loaders.train)
        if resuming:
            # Replay the batches trained before the checkpoint: same order, same augmentations.
            for _ in range(epoch_steps * cfg.grad_accum):
                next(iterator)
            resume.set_rng_state(self.rank_state["rng"])
            if self.rank_state["augment"] is not None:
                setup.loaders.train_on_device.generator.set_state(self.rank_state["augment"])
            self.rank_state = None
        self.clock.start()
        while self.step < self.total_steps and epoch_steps < self.steps_per_epoch:
            fetch_start = time.perf_counter()
            batches = next_step_batches(iterator, setup, self.ranges)
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
            epoch_done = self.step == self.total_steps or epoch_steps == self.steps_per_epoch
            log_point = self.step % cfg.log_every == 0 or epoch_done
            if log_point:
                self._log(epoch, interval_loss / len(interval_images), interval_data, interval_images)
                interval_loss.zero_()
                interval_data, interval_images = [], []
            if epoch_done:
                continue  # the epoch's end checkpoints after evaluation
            if self._stop_requested(log_point):
                self._save(epoch, epoch_steps, loss_sum)
                self._preempt()
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                self._save(epoch, epoch_steps, loss_sum)
        devices.synchronize(device)
        epoch_seconds = time.perf_counter() - epoch_start
        self._end_epoch(epoch, epoch_steps, epoch_seconds, parallel.mean_over_ranks(loss_sum / epoch_steps).item())
        self._save(epoch + 1, 0, torch.zeros((), device=device))
        if self.step < self.total_steps and self._stop_requested(True):
            self._preempt()

    def _preempt(self) -> None:
        if self.main:
            preemption.mark(self.out, self.step, self.signals.received or "a signal on another rank")
        raise Preempted(f"stopped by {self.signals.received or 'a signal on another rank'} after step {self.step}; "
                        f"the checkpoint is in {self.out / CHECKPOINT_DIR}: continue with --resume auto")

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
            "resumed_from": self.resumed_from,
            "config": asdict(cfg),
        }
