"""Write a tiny CIFAR-100 in exactly the official on-disk format.

``DIR/cifar-100-python/{train,test,meta}`` are pickles with the official keys, dtypes and shapes,
so ``torchvision.datasets.CIFAR100`` reads them with its own code. Each class has its own
colour and stripe pattern, varied per image by noise, shifts and brightness, so that a small
model learns well above chance in a CI run. Output is a pure function of the arguments.

    python -m data_prep.tiny_cifar100 --root data/tiny [--train 5000 --test 1000 --seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np

from course_utils.data.cifar import FOLDER, MANIFEST, file_md5
from data_prep.labels import COARSE_LABEL_NAMES, COARSE_OF_FINE, FINE_LABEL_NAMES

NUM_CLASSES = len(FINE_LABEL_NAMES)
SIDE = 32


def _class_templates(rng: np.random.Generator) -> np.ndarray:
    """One 32x32x3 float template per class: a colour gradient plus an oriented stripe pattern."""
    ys, xs = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    templates = np.empty((NUM_CLASSES, SIDE, SIDE, 3), np.float32)
    for label in range(NUM_CLASSES):
        base, tip = rng.uniform(0.15, 0.85, size=(2, 3))
        angle = rng.uniform(0, np.pi)
        frequency = rng.uniform(1.5, 5.0)
        ramp = (xs * np.cos(angle) + ys * np.sin(angle))[..., None]
        stripes = 0.25 * np.sin(2 * np.pi * frequency * ramp + rng.uniform(0, 2 * np.pi))
        templates[label] = base + (tip - base) * ramp + stripes
    return templates


def _images(templates: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows of 3072 uint8 values (1024 red, 1024 green, 1024 blue), as in the official files.

    Each image blends its class template with a random other class's, then shifts, rescales and
    adds noise, so that classes overlap and accuracy climbs over epochs instead of saturating.
    """
    count = len(labels)
    distractors = (labels + rng.integers(1, NUM_CLASSES, size=count)) % NUM_CLASSES
    weight = rng.uniform(0.45, 0.75, size=(count, 1, 1, 1)).astype(np.float32)
    images = weight * templates[labels] + (1 - weight) * templates[distractors]
    shifts = rng.integers(-4, 5, size=(count, 2))
    for i, (dy, dx) in enumerate(shifts):
        images[i] = np.roll(images[i], (dy, dx), axis=(0, 1))
    images *= rng.uniform(0.75, 1.25, size=(count, 1, 1, 1)).astype(np.float32)
    images += rng.normal(0, 0.2, size=images.shape).astype(np.float32)
    pixels = np.clip(images * 255, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2).reshape(count, 3 * SIDE * SIDE))


def _split(count: int, split: str, templates: np.ndarray, rng: np.random.Generator) -> dict:
    labels = rng.permutation(np.arange(count) % NUM_CLASSES)
    return {
        "filenames": [f"{FINE_LABEL_NAMES[label]}_s_{i:06d}.png" for i, label in enumerate(labels)],
        "batch_label": f"{'training' if split == 'train' else 'testing'} batch 1 of 1",
        "fine_labels": [int(label) for label in labels],
        "coarse_labels": [COARSE_OF_FINE[label] for label in labels],
        "data": _images(templates, labels, rng),
    }


def _write_pickle(obj: dict, path: Path) -> None:
    # Protocol 2 is what the official (Python 2) files use; torchvision loads with encoding="latin1".
    with open(path, "wb") as stream:
        pickle.dump(obj, stream, protocol=2)


def generate(root: Path, train: int = 5000, test: int = 1000, seed: int = 0) -> Path:
    """Write ``root/cifar-100-python`` atomically and return that folder."""
    if train < NUM_CLASSES or test < NUM_CLASSES:
        raise ValueError(f"need at least {NUM_CLASSES} images per split, one per class")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    templates = _class_templates(rng)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-cifar100-", dir=root))
    try:
        folder = staging / FOLDER
        folder.mkdir()
        _write_pickle(_split(train, "train", templates, rng), folder / "train")
        _write_pickle(_split(test, "test", templates, rng), folder / "test")
        _write_pickle({"fine_label_names": FINE_LABEL_NAMES, "coarse_label_names": COARSE_LABEL_NAMES},
                      folder / "meta")
        manifest = {
            "generator": "data_prep.tiny_cifar100", "train": train, "test": test, "seed": seed,
            "md5": {name: file_md5(folder / name) for name in ("train", "test", "meta")},
        }
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        target = root / FOLDER
        if target.exists():
            shutil.rmtree(target)
        os.replace(folder, target)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="folder that receives cifar-100-python/")
    parser.add_argument("--train", type=int, default=5000, help="training images (default 5000)")
    parser.add_argument("--test", type=int, default=1000, help="test images (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    folder = generate(args.root, args.train, args.test, args.seed)
    print(f"wrote tiny CIFAR-100 ({args.train} train / {args.test} test images) to {folder}")


if __name__ == "__main__":
    main()
