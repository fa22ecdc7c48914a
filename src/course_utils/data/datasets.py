"""The data sets a run trains on: CIFAR-100, an ImageFolder, or synthetic images (notebooks 01-05).

Every source yields ``(image, label)`` with images as normalised float tensors of shape
``3 x image_size x image_size``, so the training loop never knows where its data came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset
from torchvision import datasets
from torchvision.transforms import v2

from course_utils.data import coco
from course_utils.data.cifar import VerifiedCIFAR100
from course_utils.data.transforms import test_transform, train_transform

NUM_CLASSES = 100
DATA_SOURCES = ("cifar100", "synthetic", "imagefolder", "coco")


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


def _imagefolder(root: Path, split: str, transform: v2.Compose, image_size: int) -> Dataset:
    """Photographs come in every shape (ImageNet's too): the centre square of each makes batches stackable."""
    folder = Path(root) / split
    if not folder.is_dir():
        raise FileNotFoundError(f"ImageFolder data needs {folder}/<class>/<image> files; {folder} does not exist")
    return datasets.ImageFolder(str(folder), transform=v2.Compose([v2.RGB(), transform, v2.CenterCrop(image_size)]))


def class_count(source: str, root: str | Path | None) -> int:
    """How many classes the model must tell apart: CIFAR-100's 100, or an ImageFolder's class folders
    (ImageNet's 1,000). A detector's come from its data sets (:func:`coco.share_categories`)."""
    if source != "imagefolder" or root is None:
        return NUM_CLASSES
    folder = Path(root) / "train"
    if not folder.is_dir():
        raise FileNotFoundError(f"ImageFolder data needs {folder}/<class>/<image> files; {folder} does not exist")
    return len(datasets.folder.find_classes(str(folder))[0])


def build_datasets(spec: DataSpec) -> tuple[Dataset, Dataset]:
    """The training and test sets described by ``spec``."""
    train_tf, test_tf = train_transform(spec.image_size, spec.augment), test_transform(spec.image_size)
    if spec.source == "cifar100":
        train = VerifiedCIFAR100(spec.root, train=True, transform=train_tf, prepare_hint=spec.prepare_hint)
        test = VerifiedCIFAR100(spec.root, train=False, transform=test_tf, prepare_hint=spec.prepare_hint)
    elif spec.source == "synthetic":
        train = SyntheticImages(spec.train_samples or 50_000, spec.image_size, seed=spec.seed)
        test = SyntheticImages(spec.test_samples or 10_000, spec.image_size, seed=spec.seed + 1)
    elif spec.source == "coco":
        train = coco.CocoBoxes(spec.root, "train2017", augment=spec.augment, prepare_hint=spec.prepare_hint)
        test = coco.CocoBoxes(spec.root, "val2017", prepare_hint=spec.prepare_hint)
        coco.share_categories(train, test)
    elif spec.source == "imagefolder":
        if spec.root is None:
            raise ValueError("--data imagefolder needs --data-dir pointing at a folder with train/ and val/")
        train = _imagefolder(spec.root, "train", train_tf, spec.image_size)
        test = _imagefolder(spec.root, "val", test_tf, spec.image_size)
    else:
        raise ValueError(f"unknown data source {spec.source!r}; choose one of: {', '.join(DATA_SOURCES)}")
    return _first(train, spec.train_samples), _first(test, spec.test_samples)


def uint8_datasets(spec: DataSpec) -> tuple[Dataset, Dataset]:
    """The data sets of ``spec`` as uint8 tensors, for loaders that augment elsewhere."""
    if spec.source != "cifar100":
        raise ValueError("--loader dali and gpu-aug read CIFAR-100 (--data cifar100)")
    train = VerifiedCIFAR100(spec.root, train=True, prepare_hint=spec.prepare_hint)
    test = VerifiedCIFAR100(spec.root, train=False, prepare_hint=spec.prepare_hint)
    return _first(train, spec.train_samples), _first(test, spec.test_samples)


def image_arrays(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The HWC uint8 images and labels behind a (subset of a) CIFAR data set."""
    base, indices = (dataset.dataset, list(dataset.indices)) if isinstance(dataset, Subset) else (dataset, None)
    images, labels = base.data, np.asarray(base.targets)
    return (images, labels) if indices is None else (images[indices], labels[indices])
