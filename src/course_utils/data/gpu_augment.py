"""Augmentation on the device, in batch: the portable fast path where DALI does not run, as on AMD GPUs
(notebooks 04-05, and any run with ``--loader gpu-aug``).

The loader only decodes and sends uint8 images (a quarter of the bytes of float32); the device
then converts, resizes, crops at a random offset, flips and normalises the whole batch at once,
each image with its own random crop and flip. The result matches the CPU transforms of
:mod:`course_utils.data`: same padding with zeros, same crop positions, same flip, same numbers.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torchvision.transforms.v2 import functional as TF

from course_utils.data.transforms import CIFAR100_MEAN, CIFAR100_STD

_SCALE_CACHE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


class BatchAugment:
    """uint8 ``B x 3 x H x W`` batch on any device -> normalised float32, optionally augmented."""

    def __init__(self, image_size: int = 32, augment: bool = True, generator: torch.Generator | None = None) -> None:
        self.image_size = image_size
        self.augment = augment
        self.padding = image_size // 8
        self.generator = generator

    def _random(self, high: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """Drawn on the host (the CPU transforms' numbers), sent from pinned memory: a copy from pageable memory
        would make the host wait for the GPU's queued work, every batch."""
        drawn = torch.randint(high, shape, generator=self.generator)
        return (drawn.pin_memory() if device.type == "cuda" else drawn).to(device, non_blocking=True)

    def crop(self, images: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Each image cropped from its zero-padded version at its own (top, left) offset."""
        size, pad = self.image_size, self.padding
        padded = F.pad(images, (pad, pad, pad, pad))
        steps = torch.arange(size, device=images.device)
        rows = (offsets[:, 0, None] + steps)[:, None, :, None].expand(-1, images.shape[1], -1, padded.shape[-1])
        picked_rows = padded.gather(2, rows)
        cols = (offsets[:, 1, None] + steps)[:, None, None, :].expand(-1, images.shape[1], size, -1)
        return picked_rows.gather(3, cols)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        batch = images.to(torch.float32) / 255
        if batch.shape[-1] != self.image_size:
            batch = TF.resize(batch, [self.image_size, self.image_size], antialias=True)
        if self.augment:
            count = batch.shape[0]
            batch = self.crop(batch, self._random(2 * self.padding + 1, (count, 2), batch.device))
            flip = self._random(2, (count,), batch.device).bool()
            batch = torch.where(flip[:, None, None, None], batch.flip(-1), batch)
        mean, std = _scale(batch.device)
        return (batch - mean) / std


def _scale(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-100's mean and spread on ``device``, sent once (a list to normalize() is sent again every batch)."""
    if device not in _SCALE_CACHE:
        _SCALE_CACHE[device] = tuple(torch.tensor(values, device=device).view(1, -1, 1, 1)
                                     for values in (CIFAR100_MEAN, CIFAR100_STD))
    return _SCALE_CACHE[device]
