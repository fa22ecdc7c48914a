"""How one model is distributed over devices: not at all, DataParallel, DistributedDataParallel or FSDP
(notebooks 06-09; every run picks one with ``--distributed``; tensor parallelism, notebook 11, is in
:mod:`course_utils.parallel.tensor_parallel`).

DataParallel (``dp``) is one process that copies the model to every visible GPU in each forward
pass, splits the batch, and gathers outputs and gradients on GPU 0. DistributedDataParallel
(``ddp``) is one process per device; each keeps its own replica and only gradients travel,
all-reduced in buckets while the backward pass is still running. FSDP (``fsdp``) is one process per
device too, but each holds only a shard of the model: see :mod:`course_utils.parallel.sharding`.
Values reduced over the ranks, which need nothing at all with a single process, are in
:mod:`course_utils.parallel.collectives`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.parallel.layout import mode_of

DATAPARALLEL_PHASES = ("scatter", "replicate", "parallel_apply", "gather")  # each forward pass, in this order
# Their backward halves, as PyTorch's autograd engine names them in a trace.
DATAPARALLEL_BACKWARD = {"BroadcastBackward": "reduce_gradients", "GatherBackward": "scatter_gradients"}


def named_phase(phase: str) -> Callable[..., object]:
    """DataParallel's method ``phase``, run inside a profiler range of its name."""
    inner = getattr(nn.DataParallel, phase)

    def run(self: nn.DataParallel, *args: object) -> object:
        with torch.profiler.record_function(f"DataParallel.{phase}"):
            return inner(self, *args)

    run.__name__ = phase
    return run


class InAutocast:
    """A module called under the caller's autocast dtype. DataParallel runs each replica in a thread of its own,
    where autocast starts from the default dtype (fp16 on CUDA): ``--amp bf16`` would train them in fp16."""

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        self.module, self.device_type, self.dtype = module, device_type, dtype

    def __call__(self, *args: object, **kwargs: object) -> object:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)


class NamedDataParallel(nn.DataParallel):
    """DataParallel whose phases are named ranges in a profiler trace (``DataParallel.scatter`` ...), so that
    notebook 06 can measure each one; outside a profiler a range costs a few microseconds. Its replicas run
    under the caller's autocast dtype."""

    scatter = named_phase("scatter")
    replicate = named_phase("replicate")
    _parallel_apply = named_phase("parallel_apply")
    gather = named_phase("gather")

    def parallel_apply(self, replicas: list[nn.Module], inputs: list, kwargs: list) -> list:
        device_type = self.src_device_obj.type
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            replicas = [InAutocast(replica, device_type, dtype) for replica in replicas]
        return self._parallel_apply(replicas, inputs, kwargs)


@dataclass(frozen=True)
class DDPOptions:
    """The DistributedDataParallel knobs the course measures (PyTorch's defaults)."""

    bucket_cap_mb: float = 25.0  # gradients are all-reduced in buckets of this size
    gradient_as_bucket_view: bool = False  # gradients live inside the buckets: one copy less
    static_graph: bool = False  # the same graph every step: DDP can plan its communication once
    sync_bn: bool = False  # BatchNorm statistics over the global batch instead of each rank's share


def wrap(model: nn.Module, mode: str, device: torch.device, options: DDPOptions = DDPOptions()) -> nn.Module:
    """``model`` as ``--distributed mode`` wraps it (its facts in :data:`course_utils.parallel.layout.MODES`):
    DataParallel for the mode that drives every GPU from one process, DistributedDataParallel for one process per
    device, unchanged for one device."""
    facts = mode_of(mode)
    if facts.sharded:  # FSDP and tensor parallelism change the model in place: sharding.shard, tensor_parallel
        raise ValueError(f"wrap() wraps a model each device holds whole; --distributed {mode} splits it")
    if facts.all_gpus_in_one_process:
        # On a machine without GPUs DataParallel calls the module directly: the same numbers, one device.
        return NamedDataParallel(model)
    if not facts.one_process_per_device:
        return model
    if options.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=options.bucket_cap_mb, gradient_as_bucket_view=options.gradient_as_bucket_view,
        static_graph=options.static_graph)


def no_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip DDP's gradient all-reduce unless ``sync``: the micro-batches of gradient accumulation
    add up locally and only the last one communicates."""
    if sync or not isinstance(model, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()
