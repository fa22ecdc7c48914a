"""Notebook 00: a first look at the data a run will train on.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from torchvision.datasets import CIFAR100

from course_utils.data import cifar


def sample_grid(dataset: CIFAR100, count: int = 16) -> Figure:
    """The first ``count`` images of a CIFAR-100 set (no transform) with their class names, and a title
    that says whether they are photographs or the ``ci`` size's generated patterns."""
    columns = 8
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(columns * 1.3, rows * 1.5 + 0.4))
    for index, ax in enumerate(axes.flat):
        ax.axis("off")
        if index < count:
            ax.imshow(dataset.data[index])
            ax.set_title(dataset.classes[dataset.targets[index]], fontsize=7)
    generated = cifar.read_manifest(Path(dataset.root)) is not None
    fig.suptitle("generated CIFAR-100 (the ci size): a colour and stripe pattern per class under noise, not "
                 "photographs; the class names are the real ones" if generated else
                 "CIFAR-100: 32x32 photographs", fontsize=9)
    fig.tight_layout()
    return fig
