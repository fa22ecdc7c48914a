"""DataLoaders with the knobs the data-loading lesson turns, and one sample order for every world size
(notebooks 01-08).

Workers, pinned memory, persistent workers and prefetch depth are arguments; the sampler shards
the data over DDP ranks; :func:`make_loaders` picks the torch, DALI or on-device augmentation
path behind one interface.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, default_collate, get_worker_info

from course_utils.data import coco
from course_utils.data.dali import DaliLoader
from course_utils.data.datasets import DataSpec, build_datasets, image_arrays, uint8_datasets
from course_utils.data.gpu_augment import BatchAugment
from course_utils.data.resident import ResidentLoader
from course_utils.data.worker_signals import leave_stop_signals_to_the_trainer

LOADERS = ("torch", "dali", "gpu-aug", "resident")


class DelayedCollate:
    """Collate a batch, then sleep: a slow input pipeline on purpose, for the bottleneck lessons.

    The sleep happens where batches are made (in the worker processes when there are any), so
    more workers hide it just as they would hide slow decoding.
    """

    def __init__(self, delay_seconds: float, collate: Callable[[list], Any] = default_collate) -> None:
        self.delay_seconds, self.collate = delay_seconds, collate

    def __call__(self, samples: list) -> Any:
        time.sleep(self.delay_seconds)
        return self.collate(samples)


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class EpochSeeded(Subset):
    """All of ``dataset``, whose worker processes draw their augmentation from a seed the loader sets at every
    epoch's start (:class:`EpochSeededLoader`): the same crops and flips whether the workers are started again each
    epoch or kept alive (``persistent_workers``), so that a resumed run repeats the uninterrupted one exactly.
    (PyTorch seeds a worker once, when it starts: kept alive, its random numbers would run on from the epochs
    before, which a resumed run never saw.)"""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset, range(len(dataset)))
        self.epoch_seed = torch.zeros((), dtype=torch.int64).share_memory_()  # seen by every worker
        self._seeded: int | None = None

    def __getitem__(self, index: int) -> Any:
        worker = get_worker_info()
        if worker is not None and int(self.epoch_seed) != self._seeded:
            self._seeded = int(self.epoch_seed)
            torch.manual_seed(self._seeded + worker.id)
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list:
        return [self[index] for index in indices]


class EpochSeededLoader(DataLoader):
    """A DataLoader over :class:`EpochSeeded` data that draws each epoch's worker seed from its generator when
    an epoch's iteration starts, as PyTorch draws a new worker's base seed: a checkpoint that restores the
    generator restores the augmentation too."""

    def __iter__(self):
        if self.num_workers > 0:
            self.dataset.epoch_seed.fill_(int(torch.randint(2**62, (), generator=self.generator)))
        return super().__iter__()


def shard_sampler(dataset: Dataset, shard_id: int = 0, num_shards: int = 1, seed: int = 0) -> DistributedSampler:
    """The shuffled share of ``dataset`` that shard (rank) ``shard_id`` of ``num_shards`` reads.

    All shards draw one permutation per epoch (call ``set_epoch``) and shard r takes every
    ``num_shards``-th index from r on; the tail that does not divide evenly is dropped. A single
    process uses the same sampler with one shard, so its batch k of size N*B holds exactly the
    samples of batch k of size B on the N ranks of a DDP run.
    """
    return DistributedSampler(dataset, num_replicas=num_shards, rank=shard_id, shuffle=True, seed=seed,
                              drop_last=True)


def build_loader(dataset: Dataset, batch_size: int, *, shuffle: bool, workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False,
                 prefetch_factor: int | None = None, drop_last: bool = False, seed: int = 0,
                 delay_seconds: float = 0.0, shard_id: int = 0, num_shards: int = 1,
                 collate: Callable[[list], Any] = default_collate) -> DataLoader:
    """A DataLoader with the knobs the course measures, reading shard ``shard_id`` of ``num_shards``.

    Shuffled loaders use :func:`shard_sampler`; unshuffled ones (evaluation) read every
    ``num_shards``-th sample, so the shards cover the data exactly once. Runs repeat: the order
    comes from ``seed`` and the epoch, the augmentation from ``seed`` and the shard.
    """
    if shuffle:
        sampler = shard_sampler(dataset, shard_id, num_shards, seed)
        available = len(sampler)
    else:
        dataset = Subset(dataset, range(shard_id, len(dataset), num_shards)) if num_shards > 1 else dataset
        sampler, available = None, len(dataset)
    if batch_size > available:
        share = f" ({num_shards} ranks share {len(dataset)} samples)" if num_shards > 1 and shuffle else ""
        raise ValueError(
            f"batch size {batch_size} is larger than the data each process reads: {available} samples{share}; "
            f"lower --batch-size or use more samples")
    seeded = shuffle and workers > 0  # training with workers: augmentation drawn in them, seeded per epoch
    return (EpochSeededLoader if seeded else DataLoader)(
        EpochSeeded(dataset) if seeded else dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and workers > 0,
        prefetch_factor=prefetch_factor if workers > 0 else None,
        drop_last=drop_last,
        generator=seeded_generator(seed * 1_000 + shard_id),
        collate_fn=DelayedCollate(delay_seconds, collate) if delay_seconds > 0 else collate,
        worker_init_fn=leave_stop_signals_to_the_trainer if workers > 0 else None,
    )


@dataclass
class Loaders:
    """The training and test loaders of a run, and what the device does to each batch they yield."""

    train: Any
    test: Any
    train_on_device: BatchAugment | None = None  # gpu-aug: the batch's augmentation on the device
    test_on_device: BatchAugment | None = None
    test_sharded: bool = False  # each rank evaluates its share: the scores are summed over ranks

    @property
    def order_generator(self) -> torch.Generator | None:
        """The training loader's generator, which seeds its workers' augmentation (DALI keeps its own)."""
        return self.train.generator

    @property
    def augment_generator(self) -> torch.Generator | None:
        """The generator of the augmentation on the device, where there is one."""
        return self.train_on_device.generator if self.train_on_device is not None else None

    def set_epoch(self, epoch: int) -> None:
        """A new shuffle for ``epoch``, the same on every rank (DALI reshuffles by itself)."""
        sampler = getattr(self.train, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)

    def close(self) -> None:
        """Release what the loaders hold beyond memory (DALI's pipeline threads)."""
        for loader in (self.train, self.test):
            if hasattr(loader, "close"):
                loader.close()


def make_loaders(kind: str, spec: DataSpec, batch_size: int, device: torch.device, *, workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, prefetch_factor: int | None = None,
                 delay_seconds: float = 0.0, shard_id: int = 0, num_shards: int = 1) -> Loaders:
    """Training and test loaders of ``kind``: ``torch`` (augmentation in the workers), ``dali``
    (an NVIDIA DALI pipeline), ``gpu-aug`` (uint8 batches, augmented on the device) or ``resident`` (the whole
    uint8 data set on the device, indexed and augmented there)."""
    options = dict(workers=workers, pin_memory=pin_memory, persistent_workers=persistent_workers,
                   prefetch_factor=prefetch_factor, seed=spec.seed, shard_id=shard_id, num_shards=num_shards,
                   # Detection images differ in size: a batch is a list of images and a list of targets.
                   collate=coco.collate if spec.source == "coco" else default_collate)
    if kind in ("torch", "gpu-aug"):
        train, test = build_datasets(spec) if kind == "torch" else uint8_datasets(spec)
        loaders = Loaders(
            build_loader(train, batch_size, shuffle=True, drop_last=True, delay_seconds=delay_seconds, **options),
            build_loader(test, min(batch_size, len(test) // num_shards), shuffle=False, **options),
            test_sharded=num_shards > 1)
        if kind == "gpu-aug":
            loaders.train_on_device = BatchAugment(spec.image_size, spec.augment,
                                                   seeded_generator(spec.seed * 1_000 + shard_id))
            loaders.test_on_device = BatchAugment(spec.image_size, False)
        return loaders
    if kind == "resident":
        train, test = uint8_datasets(spec)
        if batch_size > len(train) // num_shards:
            raise ValueError(f"batch size {batch_size} is larger than the data each process reads: "
                             f"{len(train) // num_shards} samples; lower --batch-size or use more samples")
        return Loaders(
            ResidentLoader(train, batch_size, device, sampler=shard_sampler(train, shard_id, num_shards, spec.seed),
                           drop_last=True),
            ResidentLoader(test, min(batch_size, len(test) // num_shards), device, sampler=None, drop_last=False,
                           shard_id=shard_id, num_shards=num_shards),
            train_on_device=BatchAugment(spec.image_size, spec.augment, seeded_generator(spec.seed * 1_000 + shard_id)),
            test_on_device=BatchAugment(spec.image_size, False), test_sharded=num_shards > 1)
    if kind == "dali":
        train, test = (image_arrays(split) for split in uint8_datasets(spec))
        threads = max(1, workers)
        common = dict(image_size=spec.image_size, seed=spec.seed, threads=threads, device=device)
        # Every rank evaluates the whole test set: DALI pads uneven shards, which would count samples twice.
        return Loaders(DaliLoader(*train, batch_size, shuffle=True, augment=spec.augment, drop_last=True,
                                  shard_id=shard_id, num_shards=num_shards, **common),
                       DaliLoader(*test, min(batch_size, len(test[0])), shuffle=False, augment=False, **common))
    raise ValueError(f"unknown loader {kind!r}; choose one of: {', '.join(LOADERS)}")
