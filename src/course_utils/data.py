"""Datasets, transforms and DataLoaders: CIFAR-100, an ImageFolder, or synthetic images.

Every source yields ``(image, label)`` with images as normalised float tensors of shape
``3 x image_size x image_size``, so the training loop never knows where its data came from.
The loader factory exposes the knobs the data-loading lesson turns: workers, pinned memory,
persistent workers and prefetch depth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, default_collate
from torchvision import datasets
from torchvision.transforms import v2

from course_utils.cifar import VerifiedCIFAR100

CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
NUM_CLASSES = 100
DATA_SOURCES = ("cifar100", "synthetic", "imagefolder")
LOADERS = ("torch", "dali", "gpu-aug")


def train_transform(image_size: int = 32, augment: bool = True) -> v2.Compose:
    """Random crop with padding and horizontal flip (the standard CIFAR recipe), then normalise."""
    steps: list = [v2.ToImage()]
    if image_size != 32:
        steps.append(v2.Resize(image_size, antialias=True))
    if augment:
        steps += [v2.RandomCrop(image_size, padding=image_size // 8), v2.RandomHorizontalFlip()]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR100_MEAN, CIFAR100_STD)]
    return v2.Compose(steps)


def test_transform(image_size: int = 32) -> v2.Compose:
    return train_transform(image_size, augment=False)


class SyntheticImages(Dataset):
    """Random images and labels of CIFAR-100's shapes, the same for the same index and seed.

    Used to measure compute alone: no file is read and no image decoded.
    """

    def __init__(self, length: int, image_size: int = 32, num_classes: int = NUM_CLASSES, seed: int = 0):
        self.length, self.image_size, self.num_classes, self.seed = length, image_size, num_classes, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = torch.randn(3, self.image_size, self.image_size, generator=generator)
        return image, int(torch.randint(self.num_classes, (1,), generator=generator))


@dataclass(frozen=True)
class DataSpec:
    """Which data to load and how much of it."""

    source: str = "cifar100"
    root: Path | None = None
    image_size: int = 32
    augment: bool = True
    train_samples: int | None = None
    test_samples: int | None = None
    seed: int = 0
    prepare_hint: str = "python -m data_prep.cifar100 --root DIR"


def _first(dataset: Dataset, count: int | None) -> Dataset:
    """The first ``count`` samples; data_prep shuffles labels, so a prefix keeps every class."""
    if count is None or count >= len(dataset):
        return dataset
    return Subset(dataset, range(count))


def _imagefolder(root: Path, split: str, transform: v2.Compose) -> Dataset:
    folder = Path(root) / split
    if not folder.is_dir():
        raise FileNotFoundError(f"ImageFolder data needs {folder}/<class>/<image> files; {folder} does not exist")
    return datasets.ImageFolder(str(folder), transform=v2.Compose([v2.RGB(), transform]))


def build_datasets(spec: DataSpec) -> tuple[Dataset, Dataset]:
    """The training and test sets described by ``spec``."""
    train_tf, test_tf = train_transform(spec.image_size, spec.augment), test_transform(spec.image_size)
    if spec.source == "cifar100":
        train = VerifiedCIFAR100(spec.root, train=True, transform=train_tf, prepare_hint=spec.prepare_hint)
        test = VerifiedCIFAR100(spec.root, train=False, transform=test_tf, prepare_hint=spec.prepare_hint)
    elif spec.source == "synthetic":
        train = SyntheticImages(spec.train_samples or 50_000, spec.image_size, seed=spec.seed)
        test = SyntheticImages(spec.test_samples or 10_000, spec.image_size, seed=spec.seed + 1)
    elif spec.source == "imagefolder":
        if spec.root is None:
            raise ValueError("--data imagefolder needs --data-dir pointing at a folder with train/ and val/")
        train = _imagefolder(spec.root, "train", train_tf)
        test = _imagefolder(spec.root, "val", test_tf)
    else:
        raise ValueError(f"unknown data source {spec.source!r}; choose one of: {', '.join(DATA_SOURCES)}")
    return _first(train, spec.train_samples), _first(test, spec.test_samples)


class DelayedCollate:
    """Collate a batch, then sleep: a slow input pipeline on purpose, for the bottleneck lessons.

    The sleep happens where batches are made (in the worker processes when there are any), so
    more workers hide it just as they would hide slow decoding.
    """

    def __init__(self, delay_seconds: float) -> None:
        self.delay_seconds = delay_seconds

    def __call__(self, samples: list) -> Any:
        time.sleep(self.delay_seconds)
        return default_collate(samples)


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


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
                 delay_seconds: float = 0.0, shard_id: int = 0, num_shards: int = 1) -> DataLoader:
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
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and workers > 0,
        prefetch_factor=prefetch_factor if workers > 0 else None,
        drop_last=drop_last,
        generator=seeded_generator(seed * 1_000 + shard_id),
        collate_fn=DelayedCollate(delay_seconds) if delay_seconds > 0 else None,
    )


@dataclass
class Loaders:
    """The training and test loaders of a run, and what the device does to each batch they yield."""

    train: Any
    test: Any
    train_on_device: Callable[[torch.Tensor], torch.Tensor] | None = None
    test_on_device: Callable[[torch.Tensor], torch.Tensor] | None = None
    test_sharded: bool = False  # each rank evaluates its share: the scores are summed over ranks

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


def _uint8_spec(spec: DataSpec) -> tuple[Dataset, Dataset]:
    """The data sets of ``spec`` as uint8 tensors, for loaders that augment elsewhere."""
    if spec.source != "cifar100":
        raise ValueError("--loader dali and gpu-aug read CIFAR-100 (--data cifar100)")
    train = VerifiedCIFAR100(spec.root, train=True, prepare_hint=spec.prepare_hint)
    test = VerifiedCIFAR100(spec.root, train=False, prepare_hint=spec.prepare_hint)
    return _first(train, spec.train_samples), _first(test, spec.test_samples)


def _arrays(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The HWC uint8 images and labels behind a (subset of a) CIFAR data set."""
    base, indices = (dataset.dataset, list(dataset.indices)) if isinstance(dataset, Subset) else (dataset, None)
    images, labels = base.data, np.asarray(base.targets)
    return (images, labels) if indices is None else (images[indices], labels[indices])


def make_loaders(kind: str, spec: DataSpec, batch_size: int, device: torch.device, *, workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, prefetch_factor: int | None = None,
                 delay_seconds: float = 0.0, shard_id: int = 0, num_shards: int = 1) -> Loaders:
    """Training and test loaders of ``kind``: ``torch`` (augmentation in the workers), ``dali``
    (an NVIDIA DALI pipeline) or ``gpu-aug`` (uint8 batches, augmented on the device)."""
    options = dict(workers=workers, pin_memory=pin_memory, persistent_workers=persistent_workers,
                   prefetch_factor=prefetch_factor, seed=spec.seed, shard_id=shard_id, num_shards=num_shards)
    if kind in ("torch", "gpu-aug"):
        train, test = build_datasets(spec) if kind == "torch" else _uint8_spec(spec)
        loaders = Loaders(
            build_loader(train, batch_size, shuffle=True, drop_last=True, delay_seconds=delay_seconds, **options),
            build_loader(test, min(batch_size, len(test) // num_shards), shuffle=False, **options),
            test_sharded=num_shards > 1)
        if kind == "gpu-aug":
            from course_utils.gpu_augment import BatchAugment

            generator = torch.Generator().manual_seed(spec.seed * 1_000 + shard_id)
            loaders.train_on_device = BatchAugment(spec.image_size, spec.augment, generator)
            loaders.test_on_device = BatchAugment(spec.image_size, False)
        return loaders
    if kind == "dali":
        from course_utils.dali import DaliLoader

        train, test = (_arrays(split) for split in _uint8_spec(spec))
        threads = max(1, workers)
        common = dict(image_size=spec.image_size, seed=spec.seed, threads=threads, device=device)
        # Every rank evaluates the whole test set: DALI pads uneven shards, which would count samples twice.
        return Loaders(DaliLoader(*train, batch_size, shuffle=True, augment=spec.augment, drop_last=True,
                                  shard_id=shard_id, num_shards=num_shards, **common),
                       DaliLoader(*test, min(batch_size, len(test[0])), shuffle=False, augment=False, **common))
    raise ValueError(f"unknown loader {kind!r}; choose one of: {', '.join(LOADERS)}")
