"""The course size (`ci` or `workshop`) and the numbers of a training run that depend on it (every notebook
and every run). A lesson's own measurement sizes (steps timed, models swept) sit beside the lesson that
explains them, in a table keyed by the size's name.

One switch, the environment variable ``COURSE_SIZE``, decides whether a notebook trains a small
CNN for a few seconds on tiny generated data (``ci``: CI, laptops) or a ResNet on the real
CIFAR-100 (``workshop``: GPUs). Notebooks never hard-code these numbers; they ask this module.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

SIZE_VARIABLE = "COURSE_SIZE"
DATA_VARIABLE = "COURSE_DATA_DIR"
RUNS_VARIABLE = "COURSE_RUNS_DIR"
# The variables that choose which GPUs a process sees, by maker (the devices module and the doctor read them; the
# doctor without importing PyTorch, so that it starts in a moment on a node whose job is stuck).
VISIBLE_VARIABLES = {"AMD": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"), "NVIDIA": ("CUDA_VISIBLE_DEVICES",)}


class UnknownSizeError(ValueError):
    """Raised when ``COURSE_SIZE`` (or a ``size`` argument) names no known size."""


class NotAFolder(ValueError):
    """A variable names a file (or a path under one) where the course keeps a folder; the message says the fix."""


@dataclass(frozen=True)
class Size:
    """Every size-dependent default of the course, in one immutable object."""

    name: str
    model: str
    epochs: int
    batch_size: int
    lr: float
    workers: int
    train_samples: int | None  # None: the whole training set
    test_samples: int | None
    log_every: int
    image_size: int
    generated_data: bool  # True: tiny data made by data_prep, False: the official archive
    minutes_per_notebook: int  # what the README's time column promises

    def as_dict(self) -> dict:
        return asdict(self)


def usable_cores() -> int:
    """The CPU cores this process may run on: a Slurm step or a LUMI GCD slot (7 cores) gives fewer than the
    node has, and ``os.cpu_count()`` would count them all."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _workshop_workers() -> int:
    # The cores this process may use (a LUMI GCD slot has 7), less one for the training process.
    return max(1, min(7, usable_cores() - 1))


SIZES: dict[str, Size] = {
    "ci": Size(
        name="ci",
        model="small_cnn",
        epochs=4,  # three later epochs: the fewest whose spread the course's answers can tell (observe.noise)
        batch_size=64,
        lr=0.05,
        workers=0,  # on a 2-core CI machine a worker process competes with training; 04 measures workers
        # 20 steps an epoch at batch 64: a ci run trains in about 22 s on one core of a 2-core CPU (2,560 took 44 s),
        # and notebooks 01 and 02 answer alike with either (the same verdicts, the monitor 11 samples an epoch)
        train_samples=1280,
        test_samples=512,
        log_every=5,
        image_size=32,
        generated_data=True,
        minutes_per_notebook=1,
    ),
    "workshop": Size(
        name="workshop",
        model="resnet18",
        epochs=5,
        batch_size=128,
        lr=0.1,
        workers=_workshop_workers(),
        train_samples=None,
        test_samples=None,
        log_every=20,
        image_size=32,
        generated_data=False,
        minutes_per_notebook=15,
    ),
}


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def active_size_name() -> str:
    """The size named by ``COURSE_SIZE``; without it ``workshop`` on a GPU machine, else ``ci``."""
    name = os.environ.get(SIZE_VARIABLE, "").strip()
    if not name:
        return "workshop" if _gpu_visible() else "ci"
    if name not in SIZES:
        raise UnknownSizeError(
            f"{SIZE_VARIABLE}={name!r} is not a course size; valid values: {', '.join(SIZES)}"
        )
    return name


def get_size(name: str | None = None) -> Size:
    """The :class:`Size` called ``name``, or the active one when ``name`` is None."""
    name = name or active_size_name()
    if name not in SIZES:
        raise UnknownSizeError(f"unknown size {name!r}; valid values: {', '.join(SIZES)}")
    return SIZES[name]


def checkout_root() -> Path:
    """The course checkout this package lives in (the package is installed editable)."""
    return Path(__file__).resolve().parents[2]


DATASETS = ("cifar100", "coco")  # coco: notebook 10's detection data


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise ValueError(f"unknown data set {dataset!r}; choose one of: {', '.join(DATASETS)}")


def data_dir(size: Size | None = None, dataset: str = "cifar100") -> Path:
    """Where ``dataset``'s data for ``size`` lives: under ``$COURSE_DATA_DIR`` (on LUMI: project scratch) or
    ``data/``, in ``cifar100`` and ``coco`` for the official sets, in ``tiny`` and ``tiny/coco`` for the generated.

    The two sizes keep separate trees, so tiny generated data never shadows the real archive.
    """
    size = size or get_size()
    _check_dataset(dataset)
    base = _folder_of(DATA_VARIABLE)
    if not size.generated_data:
        return base / dataset
    return base / "tiny" / "coco" if dataset == "coco" else base / "tiny"


def runs_dir() -> Path:
    """Where training runs write metrics, TensorBoard events and checkpoints."""
    return _folder_of(RUNS_VARIABLE)


FOLDER_DEFAULTS = {DATA_VARIABLE: "data", RUNS_VARIABLE: "runs"}  # a folder variable -> its folder in the checkout


def _file_in_the_way(path: Path) -> Path | None:
    """The first of ``path`` and its parents that exists and is not a folder (None: a folder can be there)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None


def folder_misfit(path: Path, fix: str) -> str | None:
    """Why no folder ``path`` can be made (a file is in the way) and ``fix``, the other way to go; None when one can."""
    in_the_way = _file_in_the_way(Path(path))
    return None if in_the_way is None else f"{in_the_way} is a file where a folder belongs: move it away or {fix}"


def point_elsewhere(variable: str) -> str:
    """The fix for a folder that the variable ``variable`` chose and the course cannot use."""
    now = os.environ.get(variable) or f"unset: {FOLDER_DEFAULTS[variable]}/ of the checkout"
    return f"point {variable} (now {now}) at another folder"


def _folder_of(variable: str) -> Path:
    """The folder ``variable`` names, else its folder in the checkout; refused when a file is where it belongs."""
    folder = Path(os.environ.get(variable) or checkout_root() / FOLDER_DEFAULTS[variable])
    misfit = folder_misfit(folder, point_elsewhere(variable))
    if misfit:
        raise NotAFolder(misfit)
    return folder


def prepare_command(size: Size | None = None, root: str | Path | None = None, dataset: str = "cifar100") -> str:
    """The exact shell command that prepares ``dataset``'s data for ``size`` (in ``root`` if given)."""
    size = size or get_size()
    _check_dataset(dataset)
    module = f"data_prep.{'tiny_' if size.generated_data else ''}{dataset}"
    return f"python -m {module} --root {root or data_dir(size, dataset)}"
