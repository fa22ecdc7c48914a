"""CIFAR-100's normalisation and the standard augmentation, in one place (notebooks 01-05).

The CPU transforms here, the DALI pipeline and the on-device augmentation all normalise with the
same mean and standard deviation, so they import them from this module.
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2

CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


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
