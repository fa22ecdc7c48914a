"""Shared fixtures: a small generated CIFAR-100 and quick training options."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_prep.tiny_cifar100 import generate


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny CIFAR-100 (600 train / 200 test images) shared by the whole session; do not modify."""
    root = tmp_path_factory.mktemp("tiny")
    generate(root, train=600, test=200, seed=0)
    return root


@pytest.fixture
def quick(tiny_root: Path, tmp_path: Path) -> dict:
    """Options for a training run of a few seconds on the CPU."""
    return dict(size="ci", data_dir=str(tiny_root), train_samples=256, test_samples=128, epochs=2,
                batch_size=32, workers=0, log_every=2, out=str(tmp_path / "run"), progress=False, device="cpu")
