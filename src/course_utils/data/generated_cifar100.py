"""A tiny CIFAR-100 in exactly the official on-disk format, and the checksums it must have (notebook 00, CI,
and every ``ci`` run).

``DIR/cifar-100-python/{train,test,meta}`` are pickles with the official keys, dtypes and shapes,
so ``torchvision.datasets.CIFAR100`` reads them with its own code. Each class has its own
colour and stripe pattern, varied per image by noise, shifts and brightness, so that a small
model learns well above chance in a CI run.

The files are a pure function of three numbers (training images, test images, seed), which the
manifest beside them records. Their MD5 sums, which guard the unpickling, are therefore not read
from the data folder: :func:`expected_md5` makes the files again in memory and hashes them, so a
manifest or pickle changed by someone else in a shared data folder is refused before it is loaded.
Making the full-size stand-in again costs about 12 s, so the sums are computed once (when the files are
generated, or at their first check) and kept in the user's own cache folder, beside what the files depend on:
the generator's parameters, its code and NumPy's version; never in the data folder, which others may write.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
from pathlib import Path

import numpy as np
from torchvision.datasets import CIFAR100

from course_utils.atomic_files import whole_directory, write_text_atomic
from course_utils.data import cifar100_labels
from course_utils.data.cifar100_labels import COARSE_LABEL_NAMES, COARSE_OF_FINE, FINE_LABEL_NAMES

FOLDER = CIFAR100.base_folder  # "cifar-100-python"
MANIFEST = "course-manifest.json"
NUM_CLASSES = len(FINE_LABEL_NAMES)
SIDE = 32
LIMITS = {"train": 50_000, "test": 10_000}  # the official split sizes: more is not CIFAR-100


def class_templates(rng: np.random.Generator) -> np.ndarray:
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


def pattern_images(templates: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
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
        "data": pattern_images(templates, labels, rng),
    }


def check_parameters(train: int, test: int, seed: int) -> None:
    """Refuse sizes this generator does not make (one image per class at least, the official sizes at most)."""
    for name, value in (("train", train), ("test", test)):
        if not isinstance(value, int) or not NUM_CLASSES <= value <= LIMITS[name]:
            raise ValueError(f"{name} images must be a whole number from {NUM_CLASSES} (one per class) to "
                             f"{LIMITS[name]}, not {value!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"the seed must be a whole number from 0, not {seed!r}")


def file_bytes(train: int, test: int, seed: int) -> dict[str, bytes]:
    """The three files' contents: ``train``, ``test`` and ``meta``."""
    check_parameters(train, test, seed)
    rng = np.random.default_rng(seed)
    templates = class_templates(rng)
    contents = {name: _split(count, name, templates, rng) for name, count in (("train", train), ("test", test))}
    contents["meta"] = {"fine_label_names": FINE_LABEL_NAMES, "coarse_label_names": COARSE_LABEL_NAMES}
    # Protocol 2 is what the official (Python 2) files use; torchvision loads with encoding="latin1".
    return {name: pickle.dumps(value, protocol=2) for name, value in contents.items()}


CACHE_VARIABLE = "COURSE_CACHE_DIR"  # where the kept sums live (default: $XDG_CACHE_HOME or ~/.cache, course-utils/)


def sums_cache() -> Path:
    """The user's own file of kept sums: in ``$COURSE_CACHE_DIR``, else the user's cache folder."""
    folder = os.environ.get(CACHE_VARIABLE) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
        "course-utils"
    return Path(folder) / "generated-cifar100-md5.json"


def generator_code() -> str:
    """A digest of the code the files are made by (this module and the label names): an update that changes the
    files changes it, so that sums kept from the code before are not taken for the sums of the files made now."""
    digest = hashlib.sha256()
    for module in (__file__, cifar100_labels.__file__):
        digest.update(Path(module).read_bytes())
    return digest.hexdigest()


def _cache_key(train: int, test: int, seed: int) -> str:
    return json.dumps({"train": train, "test": test, "seed": seed, "numpy": np.__version__, "code": generator_code()},
                      sort_keys=True)


def _kept() -> dict:
    try:
        kept = json.loads(sums_cache().read_text())
    except (OSError, ValueError):  # none yet, or a damaged file: computed again
        return {}
    return kept if isinstance(kept, dict) else {}


def _keep(key: str, sums: dict[str, str]) -> None:
    """Add ``sums`` to the cache; a cache folder that cannot be written costs the next process the time again."""
    try:
        write_text_atomic(sums_cache(), json.dumps({**_kept(), key: sums}, indent=1) + "\n")
    except OSError:
        pass


def md5_of(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.md5(data).hexdigest() for name, data in files.items()}


@functools.cache
def expected_md5(train: int, test: int, seed: int) -> dict[str, str]:
    """File name -> MD5 of the files these parameters make: kept from an earlier process, else computed here
    (about a second at the ``ci`` size, 12 s at the official sizes) and kept."""
    key = _cache_key(train, test, seed)
    kept = _kept().get(key)
    if isinstance(kept, dict) and set(kept) == {"train", "test", "meta"}:
        return kept
    sums = md5_of(file_bytes(train, test, seed))
    _keep(key, sums)
    return sums


def parameters(manifest: dict) -> tuple[int, int, int]:
    """The ``(train, test, seed)`` a manifest records; a ValueError for anything this generator did not write."""
    try:
        values = (manifest["train"], manifest["test"], manifest["seed"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"the manifest does not record train, test and seed ({error})") from error
    check_parameters(*values)
    return values


def generate(root: Path, train: int = 5000, test: int = 1000, seed: int = 0) -> Path:
    """Write ``root/cifar-100-python`` atomically and return that folder."""
    files = file_bytes(train, test, seed)
    _keep(_cache_key(train, test, seed), md5_of(files))  # the processes that read them need not make them again
    with whole_directory(Path(root) / FOLDER) as folder:
        for name, data in files.items():
            (folder / name).write_bytes(data)
        manifest = {"generator": "course_utils.data.generated_cifar100", "train": train, "test": test, "seed": seed}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return Path(root) / FOLDER
