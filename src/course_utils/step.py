"""What one training step needs: the set-up built from a :class:`TrainConfig`, the step itself,
fetching batches, and evaluation. The loop over epochs is in :mod:`course_utils.loop`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from course_utils import config, devices, distributed, models, parallel
from course_utils.data import DataSpec, Loaders, make_loaders
from course_utils.parallel import DDPOptions
from course_utils.profiling import Ranges
from course_utils.run_config import AMP_DTYPES, TrainConfig


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


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


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


def next_step_batches(iterator: Iterator, setup: Setup, ranges: Ranges) -> list | None:
    """The ``grad_accum`` micro-batches of the next step, or None when the epoch has fewer left."""
    batches = []
    for _ in range(setup.cfg.grad_accum):
        batch = next_batch(iterator, setup.device, ranges, setup.cfg.channels_last, setup.loaders.train_on_device)
        if batch is None:
            return None
        batches.append(batch)
    return batches
