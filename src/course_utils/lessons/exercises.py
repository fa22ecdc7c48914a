"""No notebook: the verdict a check cell prints after a learner's change, and the small seeded model and
batches the lessons' checks run the learner's code on.

Each notebook's exercise changes code in a cell; its check cell calls the lesson's check, which runs the
learner's code and returns whether the change did what the exercise asked, with what it showed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Check:
    """Whether an exercise is done, and what the check measured."""

    done: bool
    text: str

    def __str__(self) -> str:
        return ("Done: " if self.done else "Not yet: ") + self.text


def tiny_cnn(classes: int = 100) -> nn.Module:
    """A convolution and a linear layer, seeded: small enough that a check trains it in a second on a CPU."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(256, classes))


def fixed_batches(count: int, size: int = 8, classes: int = 100) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` seeded batches of random 16x16 images and labels."""
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(size, 3, 16, 16, generator=generator), torch.randint(classes, (size,), generator=generator))
            for _ in range(count)]
