"""One training step: fetch the micro-batches, forward, backward, optimizer step (notebooks 01, 03, 05, 07).

This is the code a learner copies into their own script: autocast and the GradScaler for mixed
precision, ``no_sync`` for gradient accumulation under DDP, and the named ranges the profiler shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from course_utils.observe.profiling import NO_RANGES, Ranges
from course_utils.parallel.wrappers import no_sync
from course_utils.training.setup import Setup


def train_step(setup: Setup, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], ranges: Ranges) -> torch.Tensor:
    """One optimizer step over ``batches`` (micro-batches already on the device, their gradients
    accumulated; under DDP only the last one is all-reduced); returns the mean loss."""
    setup.optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=setup.device)
    for index, (images, labels) in enumerate(batches):
        with no_sync(setup.wrapped, sync=index == len(batches) - 1):
            with ranges("forward"), setup.autocast():
                loss = setup.forward_loss(images, labels) / len(batches)
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
        images = to_device(images, device)
        if on_device is not None:
            images = on_device(images)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, to_device(labels, device)


def to_device(value: Any, device: torch.device) -> Any:
    """A batch's tensors on ``device``: a tensor, or the lists of images and target dicts of detection."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, list):
        return [to_device(item, device) for item in value]
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value


def next_step_batches(iterator: Iterator, setup: Setup, ranges: Ranges) -> list | None:
    """The ``grad_accum`` micro-batches of the next step, or None when the epoch has fewer left."""
    batches = []
    for _ in range(setup.cfg.grad_accum):
        batch = next_batch(iterator, setup.device, ranges, setup.cfg.channels_last, setup.loaders.train_on_device)
        if batch is None:
            return None
        batches.append(batch)
    return batches


def device_batches(setup: Setup) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One pass over the training loader, each batch on the device as training would see it."""
    iterator = iter(setup.loaders.train)
    while (batch := next_batch(iterator, setup.device, NO_RANGES, setup.cfg.channels_last,
                               setup.loaders.train_on_device)) is not None:
        yield batch
