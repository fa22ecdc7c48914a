"""The whole data set kept on the device, each batch indexed and augmented there (notebook 04, and any run with
``--loader resident``).

CIFAR-100's 60,000 uint8 images are 180 MB: a GPU holds them many times over. Kept there, a batch is one
indexing operation on the device, with no worker processes, no host memory to pin and no copy per step; the
augmentation is :mod:`course_utils.data.gpu_augment`'s (the same crops and flips as the CPU transforms). The
CIFAR speed records are set this way. The order is :func:`course_utils.data.loaders.shard_sampler`'s, so a run
reads the same batches with any loader and any number of ranks.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, DistributedSampler, Subset


def _uint8_tensors(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``N x 3 x H x W`` uint8 images and the labels of a (subset of a) CIFAR data set, without copying a
    sample at a time."""
    base, indices = (dataset.dataset, list(dataset.indices)) if isinstance(dataset, Subset) else (dataset, None)
    images, labels = base.images, torch.as_tensor(base.targets)
    return (images, labels) if indices is None else (images[indices], labels[indices])


class ResidentLoader:
    """Batches of a data set held whole on ``device``: uint8 images and their labels, already there."""

    generator = None  # the order comes from the sampler's seed and epoch; nothing else for a checkpoint to hold

    def __init__(self, dataset: Dataset, batch_size: int, device: torch.device, *,
                 sampler: DistributedSampler | None, drop_last: bool, shard_id: int = 0, num_shards: int = 1) -> None:
        images, labels = _uint8_tensors(dataset)
        self.images, self.labels = images.to(device), labels.to(device)
        self.batch_size, self.drop_last, self.device, self.sampler = batch_size, drop_last, device, sampler
        # Unshuffled (evaluation): every num_shards-th sample from shard_id on, as build_loader's Subset reads them.
        self._fixed_order = None if sampler is not None else list(range(shard_id, len(images), num_shards))

    def _order(self) -> list[int]:
        return list(self.sampler) if self.sampler is not None else self._fixed_order

    def __len__(self) -> int:
        count = len(self.sampler) if self.sampler is not None else len(self._fixed_order)
        return count // self.batch_size if self.drop_last else -(-count // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.as_tensor(self._order(), dtype=torch.long).to(self.device)
        for number in range(len(self)):
            picked = order[number * self.batch_size:(number + 1) * self.batch_size]
            yield self.images[picked], self.labels[picked]
