"""The set-up of a run, built once from its options: process group, device, data, model, optimizer
(notebooks 01-11). The step is in :mod:`course_utils.training.step`, the loop over epochs in
:mod:`course_utils.training.loop`.
"""

from __future__ import annotations

import contextlib
import gc
import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from course_utils import config, devices
from course_utils.data import coco
from course_utils.data.datasets import DataSpec, class_count
from course_utils.data.loaders import Loaders, make_loaders
from course_utils.parallel import process_group, sharding, tensor_parallel
from course_utils.parallel.collectives import from_rank_zero
from course_utils.parallel.layout import Layout, mode_of
from course_utils.parallel.wrappers import DDPOptions, wrap
from course_utils.shared_folders import new_folder
from course_utils.training import models
from course_utils.training.activation_checkpointing import checkpoint_blocks
from course_utils.training.options import AMP_DTYPES, DDP_KNOBS, TrainOptions, check_parallel_options
from course_utils.training.preemption import Preempted


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        mismatch = devices.gpu_mismatch_here()
        if mismatch:  # never fall back to the CPU in silence on a GPU node
            raise RuntimeError(f"{mismatch} To train on the CPU on purpose, pass --device cpu.")
        return devices.default_device()  # under DDP, the GPU of this rank: joining the group made it current
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} asked for a GPU, but torch sees none; use --device cpu")
    # With its index, made current: CUDA events, streams and DALI work on the current GPU, not on the model's.
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    torch.cuda.set_device(device)
    return device


def _join_process_group(cfg: TrainOptions) -> process_group.Placement:
    """Join the process group for DDP and FSDP; refuse a launch under torchrun/srun that would train N
    copies alone."""
    if mode_of(cfg.distributed).one_process_per_device:  # ranks on the CPU talk through gloo, also on a GPU machine
        return process_group.join(cfg.dist_timeout, backend="gloo" if cfg.device == "cpu" else None, alone=True)
    where = process_group.placement()
    if where.distributed:
        raise ValueError(f"this process is rank {where.rank} of {where.world_size} ({where.source}), but "
                         f"--distributed is {cfg.distributed}: every rank would train alone; add --distributed ddp")
    return where


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices), so that a CPU run repeats exactly."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Setup:
    """Everything a run trains with, built once from resolved :class:`TrainOptions`.

    A context manager: leaving it releases the loaders and leaves the process group.
    """

    cfg: TrainOptions
    where: process_group.Placement
    device: torch.device
    loaders: Loaders
    model: nn.Module  # the module itself: evaluation and checkpoints use it
    wrapped: nn.Module  # the model, or its DataParallel / DDP wrapper
    step_model: nn.Module  # what training calls: ``wrapped``, or its torch.compile'd version
    recomputed: list[nn.Module]  # the blocks whose forward runs again in the backward (activation checkpointing)
    optimizer: torch.optim.Optimizer
    criterion: nn.Module
    scaler: torch.amp.GradScaler
    autocast_dtype: torch.dtype | None  # None: no autocast, full fp32
    layout: Layout  # how the ranks are spread: data-parallel ranks, tensor-parallel degree, sharded or not
    conv_autotune: devices.ConvAutotune  # whether cuDNN or MIOpen times convolution kernels, and why

    def __enter__(self) -> Setup:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.loaders.close()
        # DDP's reducer holds the process group: without the wrapper, the group ends inside leave(), after its
        # barrier, instead of whenever the wrapper is freed (see process_group.leave).
        self.wrapped = self.step_model = self.model
        gc.collect()
        process_group.leave(together=kind is None or issubclass(kind, Preempted))

    def forward_loss(self, images: torch.Tensor | list, targets: torch.Tensor | list) -> torch.Tensor:
        """The loss of one batch: a classifier's cross-entropy, or the sum of a detector's losses (torchvision's
        detectors compute their own in training mode: classification and box regression, RPN and heads)."""
        if self.cfg.detection:
            return sum(self.step_model(images, targets).values())
        return self.criterion(self.step_model(images), targets)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass where the run asks for it."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @property
    def images_per_step(self) -> int:
        """Images one optimizer step of this process consumes."""
        return self.cfg.batch_size * self.cfg.grad_accum


def prepare(options: TrainOptions) -> Setup:
    """Join the process group if DDP, seed, pick the device, and build data, model and optimizer."""
    cfg = options.resolved()
    where = _join_process_group(cfg)
    made = None
    try:
        if options.out is None:  # named from the clock: rank 0 makes it, with a suffix if a run of this second has it
            made = new_folder(Path(cfg.out)) if where.is_main else None
            cfg = replace(cfg, out=from_rank_zero(None if made is None else str(made)))
        return _build(cfg, where)
    except BaseException:
        if made is not None:
            with contextlib.suppress(OSError):  # the folder it made, gone with it while empty
                made.rmdir()
        process_group.leave()
        raise


def _loaders(cfg: TrainOptions, where: process_group.Placement, device: torch.device, layout: Layout) -> Loaders:
    """The run's data; the ranks of a tensor-parallel group read the same share of it."""
    size = config.get_size(cfg.size)
    spec = DataSpec(source=cfg.data, root=Path(cfg.data_dir) if cfg.data_dir else None,
                    image_size=cfg.image_size, augment=cfg.augment, train_samples=cfg.train_samples,
                    test_samples=cfg.test_samples, seed=cfg.seed,
                    prepare_hint=config.prepare_command(size, cfg.data_dir, "coco" if cfg.detection else "cifar100"))
    pin_memory = device.type == "cuda" if cfg.pin_memory is None else cfg.pin_memory
    return make_loaders(cfg.loader, spec, cfg.batch_size, device, workers=cfg.workers, pin_memory=pin_memory,
                        persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor,
                        delay_seconds=cfg.input_delay_ms / 1000, shard_id=where.rank // layout.tensor_parallel,
                        num_shards=layout.data_ranks)


def _build(cfg: TrainOptions, where: process_group.Placement) -> Setup:
    device = _pick_device(cfg.device)
    check_parallel_options(cfg, device)
    layout = Layout(cfg.distributed, cfg.tp_size, where.world_size)
    # The same seed on every rank: the replicas start equal (DDP also broadcasts rank 0's weights).
    seed_everything(cfg.seed)
    # cuDNN times the kernels of each new shape in the first iterations; not on ROCm, where MIOpen's find database
    # answers instead, nor for a detector, whose every image size is new (devices.conv_autotune says why).
    autotune = devices.conv_autotune(device.type, torch.version.hip, cfg.detection)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = autotune.on
    tp = layout.tensor_parallel
    if tp > 1:  # refused before any data is read: the sizes alone say it (a model on "meta" holds no numbers)
        with torch.device("meta"):
            wrong = tensor_parallel.misfits(models.build(cfg.model, image_size=cfg.image_size), tp)
        if wrong:
            raise ValueError("; ".join(wrong))
    loaders = _loaders(cfg, where, device, layout)
    # A detector's head: the categories of both splits, which its data sets share (COCO numbers them with gaps).
    classes = (coco.ground_truth(loaders.test).categories.num_classes if cfg.detection
               else class_count(cfg.data, cfg.data_dir))
    model = models.build(cfg.model, num_classes=classes, image_size=cfg.image_size).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    recomputed = checkpoint_blocks(models.blocks(model)) if cfg.activation_checkpointing else []
    wrapped = _distribute(model, cfg, device, layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay, fused=cfg.fused_optimizer or None)
    step_model = torch.compile(wrapped, mode=cfg.compile) if cfg.compile else wrapped
    # fp16 has a narrow range: small gradients underflow to zero unless the loss is scaled up first.
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    return Setup(cfg, where, device, loaders, model, wrapped, step_model, recomputed, optimizer,
                 nn.CrossEntropyLoss(), scaler, AMP_DTYPES[cfg.amp], layout, autotune)


def _distribute(model: nn.Module, cfg: TrainOptions, device: torch.device, layout: Layout) -> nn.Module:
    """The model as ``--distributed`` lays it out: split in place by tensor parallelism and sharded by FSDP
    (over the whole group, or over the data dimension of a 2-D mesh), or wrapped (or not)."""
    if layout.mode.splits_layers:
        grid = layout.mesh(device.type)
        tensor_parallel.parallelize(model, models.blocks(model), grid["tensor"])
        if not layout.mode.fsdp:
            return model
        return sharding.shard(model, models.blocks(model), AMP_DTYPES[cfg.amp], cfg.offload, device,
                              mesh=grid["data"])
    if layout.mode.fsdp:
        return sharding.shard(model, models.blocks(model), AMP_DTYPES[cfg.amp], cfg.offload, device)
    return wrap(model, cfg.distributed, device, DDPOptions(**{knob: getattr(cfg, knob) for knob in DDP_KNOBS}))
