"""NVIDIA DALI pipelines over CIFAR-100, behind the same (images, labels) interface as a DataLoader
(notebook 04, and any run with ``--loader dali``).

DALI moves decoding and augmentation into a C++ pipeline, on the GPU when there is one (here: random
crop with zero padding, horizontal flip, normalisation). It runs with CPU operators where there is
no GPU, so the same code runs in CI. It has no ROCm build and no wheel outside x86_64/aarch64
with NVIDIA drivers: there :class:`DaliUnavailable` says so and points to ``--loader gpu-aug``.
Sharding (``shard_id`` / ``num_shards``) follows ``DistributedSampler``: each shard takes every
``num_shards``-th sample of the epoch's order, padded so that all shards have the same length.
"""

from __future__ import annotations

import gc
import importlib.metadata
import math
import platform
import re
from collections.abc import Iterator

import numpy as np
import torch

from course_utils.data.transforms import CIFAR100_MEAN, CIFAR100_STD

CPU = torch.device("cpu")
AMD_HINT = "on AMD GPUs (LUMI) use --loader gpu-aug, which augments on the GPU in PyTorch"


class DaliUnavailable(RuntimeError):
    """DALI cannot run here; the message says why and what to use instead."""


def check_available() -> None:
    """Raise :class:`DaliUnavailable` with the reason when DALI cannot run in this environment."""
    if torch.version.hip is not None:
        raise DaliUnavailable(f"NVIDIA DALI has no ROCm build; {AMD_HINT}")
    if platform.machine() not in ("x86_64", "aarch64"):
        raise DaliUnavailable(f"NVIDIA DALI has no build for {platform.machine()}; {AMD_HINT}")
    wanted = f"nvidia-dali-cuda{cuda_major(torch.version.cuda) or 13}0"
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as error:
        raise DaliUnavailable(f"NVIDIA DALI is not installed: pip install {wanted} (x86_64 with an NVIDIA GPU or "
                              f"none); {AMD_HINT}") from error
    mismatch = runtime_mismatch(installed_dali_cuda(), torch.version.cuda, torch.cuda.is_available())
    if mismatch:
        raise DaliUnavailable(mismatch)


def cuda_major(version: str | None) -> int | None:
    """12 for "12.8", 13 for "13.0"; None without one (a CPU or ROCm build)."""
    return int(version.split(".")[0]) if version else None


def installed_dali_cuda() -> int | None:
    """The CUDA major version the installed DALI wheel was built for (``nvidia-dali-cuda130``: 13)."""
    for distribution in importlib.metadata.distributions():
        found = re.fullmatch(r"nvidia-dali-cuda(\d+?)0", (distribution.metadata["Name"] or "").lower())
        if found:
            return int(found.group(1))
    return None


def runtime_mismatch(dali_cuda: int | None, torch_cuda: str | None, gpu: bool) -> str | None:
    """Why DALI and PyTorch must not share this GPU process: each would load its own CUDA runtime (DALI's
    built for one major version, PyTorch's for another), a pairing neither project tests. None where they agree,
    or where no GPU is used (DALI's CPU operators need no CUDA runtime)."""
    if not gpu or dali_cuda is None or cuda_major(torch_cuda) in (None, dali_cuda):
        return None
    return (f"the installed DALI is built for CUDA {dali_cuda} and this PyTorch for CUDA {torch_cuda}: two CUDA "
            f"runtimes in one process, never tested together. Install the matching wheel: pip install "
            f"nvidia-dali-cuda{cuda_major(torch_cuda)}0 (and pip uninstall nvidia-dali-cuda{dali_cuda}0), or use "
            "--loader gpu-aug")


def shard_order(count: int, epoch: int, seed: int, shuffle: bool, shard_id: int, num_shards: int) -> np.ndarray:
    """The sample indices shard ``shard_id`` reads in ``epoch`` (DistributedSampler's recipe)."""
    order = np.random.default_rng(seed + epoch).permutation(count) if shuffle else np.arange(count)
    total = math.ceil(count / num_shards) * num_shards
    order = np.concatenate([order, order[: total - count]])  # pad by repeating the first samples
    return order[shard_id:total:num_shards]


class _EpochSource:
    """DALI's external source: the batches of one shard, in a new order every epoch."""

    def __init__(self, loader: DaliLoader) -> None:
        self.images, self.labels = loader.images, loader.labels
        self.batch_size, self.drop_last = loader.batch_size, loader.drop_last
        self.order_args = dict(seed=loader.seed, shuffle=loader.shuffle, shard_id=loader.shard_id,
                               num_shards=loader.num_shards)
        self.epoch, self.order = -1, np.empty(0, dtype=np.int64)

    def __call__(self, info) -> tuple[np.ndarray, np.ndarray]:
        if info.epoch_idx != self.epoch:  # one permutation per epoch, not per batch
            self.epoch, self.order = info.epoch_idx, shard_order(len(self.images), info.epoch_idx, **self.order_args)
        order = self.order
        start = info.iteration * self.batch_size
        picked = order[start:start + self.batch_size]
        if len(picked) == 0 or (self.drop_last and len(picked) < self.batch_size):
            raise StopIteration
        # One array per batch (outermost dimension: the samples), gathered at once rather than per sample.
        return self.images[picked], self.labels[picked, None]


class DaliLoader:
    """Batches of normalised float images (``B x 3 x S x S``) and int64 labels from DALI."""

    generator = None  # the pipeline seeds its own operators; nothing for a checkpoint to hold

    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, *, shuffle: bool, augment: bool,
                 image_size: int = 32, seed: int = 0, drop_last: bool = False, shard_id: int = 0,
                 num_shards: int = 1, threads: int = 2, device: torch.device = CPU) -> None:
        check_available()
        if batch_size > len(images):
            raise ValueError(f"batch size {batch_size} is larger than the data set ({len(images)} samples); "
                             f"lower --batch-size or use more samples")
        self.images, self.labels = np.ascontiguousarray(images), np.asarray(labels, dtype=np.int64)
        self.batch_size, self.shuffle, self.augment, self.drop_last = batch_size, shuffle, augment, drop_last
        self.image_size, self.seed, self.shard_id, self.num_shards = image_size, seed, shard_id, num_shards
        self.device = device
        self.shard_size = math.ceil(len(images) / num_shards)
        self._iterator = self._build(threads)

    def __len__(self) -> int:
        full, rest = divmod(self.shard_size, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def _build(self, threads: int):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        on_gpu = self.device.type == "cuda"
        size, pad, native = self.image_size, self.image_size // 8, self.images.shape[2]
        source, augment = _EpochSource(self), self.augment  # the graph holds no reference back to the loader

        @pipeline_def(batch_size=self.batch_size, num_threads=threads, seed=self.seed,
                      device_id=(self.device.index or 0) if on_gpu else None)
        def pipeline():
            images, labels = fn.external_source(source=source, num_outputs=2, batch=True, batch_info=True,
                                                layout=["HWC", ""])
            if on_gpu:
                images = images.gpu()
            if size != native:
                images = fn.resize(images, resize_x=size, resize_y=size)
            mirror = 0
            if augment:
                anchor = fn.random.uniform(range=(-pad, pad + 1), shape=2, dtype=types.INT32)
                images = fn.slice(images, start=anchor, shape=[size, size], axes=[0, 1],
                                  out_of_bounds_policy="pad", fill_values=0)
                mirror = fn.random.coin_flip()
            images = fn.crop_mirror_normalize(images, mirror=mirror, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[255 * m for m in CIFAR100_MEAN],
                                              std=[255 * s for s in CIFAR100_STD])
            return images, labels

        policy = LastBatchPolicy.DROP if self.drop_last else LastBatchPolicy.PARTIAL
        return DALIGenericIterator([pipeline()], ["images", "labels"], auto_reset=True, last_batch_policy=policy)

    def close(self) -> None:
        """Shut the pipeline's threads down now.

        A DALI pipeline left for the garbage collector can be inherited by DataLoader worker
        processes forked later, whose collector then waits forever for threads they do not have.
        """
        if self._iterator is not None:
            self._iterator = None
            gc.collect()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for (batch,) in self._iterator:
            yield batch["images"], batch["labels"].reshape(-1).long()
