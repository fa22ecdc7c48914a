"""CIFAR-100 read by torchvision's own reader, with checksums that come from the code (notebook 00, and
every run that trains on CIFAR-100).

torchvision checks every file against MD5 sums before it unpickles anything, and unpickling a
file can run code. The sums therefore never come from the data folder, which a whole class may
share on project scratch: the official files are checked against the official archive's sums
(torchvision's), and the tiny generated set against the sums of the files its recorded
parameters make (:mod:`course_utils.data.generated_cifar100`). A file changed after it was written,
or a forged manifest, is refused before anything is loaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torchvision.datasets import CIFAR100

from course_utils.data import generated_cifar100
from course_utils.data.generated_cifar100 import FOLDER, MANIFEST

OFFICIAL_MD5 = {
    CIFAR100.train_list[0][0]: CIFAR100.train_list[0][1],
    CIFAR100.test_list[0][0]: CIFAR100.test_list[0][1],
    CIFAR100.meta["filename"]: CIFAR100.meta["md5"],
}


class DatasetMissingError(FileNotFoundError):
    """The data is not on disk; the message names the command that prepares it."""


class DatasetCorruptError(RuntimeError):
    """A data file does not match its checksum; the message names the command that fixes it."""


def file_md5(path: Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as stream:
        while chunk := stream.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(root: Path) -> dict | None:
    """The manifest beside generated data (its parameters, no checksums), or None for the official files."""
    path = Path(root) / FOLDER / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
        generated_cifar100.parameters(manifest)
    except ValueError as error:  # JSONDecodeError included
        raise DatasetCorruptError(f"{path} is not a manifest this course writes ({error}); delete "
                                  f"{path.parent} and prepare the data again") from error
    return manifest


def expected_md5(root: Path) -> dict[str, str]:
    """File name -> MD5 that the files under ``root`` must have: the official sums, or those of the files
    the generated set's parameters make."""
    manifest = read_manifest(root)
    if manifest is None:
        return dict(OFFICIAL_MD5)
    return generated_cifar100.expected_md5(*generated_cifar100.parameters(manifest))


def mismatched_files(root: Path) -> list[str]:
    """Names of files under ``root`` that are missing or differ from their checksums."""
    folder = Path(root) / FOLDER
    return [
        name for name, md5 in expected_md5(root).items()
        if not (folder / name).is_file() or file_md5(folder / name) != md5
    ]


def kind(root: Path) -> str:
    """Which CIFAR-100 lives under ``root``, without the folder (recorded results say it): official,
    a generated stand-in, or none."""
    if not (Path(root) / FOLDER).is_dir():
        return "no CIFAR-100"
    manifest = read_manifest(root)
    if manifest is None:
        return "official CIFAR-100 (50000 train / 10000 test images)"
    return (f"generated stand-in for CIFAR-100 in the official format, class patterns instead of photos "
            f"({manifest['train']} train / {manifest['test']} test images, seed {manifest['seed']})")


def describe(root: Path) -> str:
    """One line saying which CIFAR-100 lives under ``root`` and where."""
    return f"{kind(root)} in {Path(root) / FOLDER}"


class VerifiedCIFAR100(CIFAR100):
    """``torchvision.datasets.CIFAR100`` with the checksums of :func:`expected_md5`, whose
    samples are ``3 x 32 x 32`` uint8 tensors rather than PIL images.

    torchvision wraps each decoded array in a PIL image, which the transforms then turn back
    into a tensor: for a 32x32 image that round trip makes a sample about 1.5x as expensive as
    the augmentation alone, time a DataLoader pays per sample. ``prepare_hint`` is the shell
    command printed when the data is missing or damaged.
    """

    def __init__(self, root: str | Path, train: bool = True, transform: Callable | None = None,
                 prepare_hint: str = "python -m data_prep.cifar100 --root DIR") -> None:
        root = Path(root)
        folder = root / FOLDER
        try:
            sums = expected_md5(root)
        except DatasetCorruptError as error:
            raise DatasetCorruptError(f"{error} with:\n    {prepare_hint}") from error
        missing = [name for name in sums if not (folder / name).is_file()]
        if missing:
            raise DatasetMissingError(
                f"CIFAR-100 is not in {folder} (missing: {', '.join(missing)}). Prepare it with:\n"
                f"    {prepare_hint}")
        # Instance attributes shadow the class's official sums; torchvision checks them before unpickling.
        self.train_list = [["train", sums["train"]]]
        self.test_list = [["test", sums["test"]]]
        self.meta = {**CIFAR100.meta, "md5": sums["meta"]}
        try:
            super().__init__(str(root), train=train, transform=transform, download=False)
        except RuntimeError as error:
            bad = mismatched_files(root)
            raise DatasetCorruptError(
                f"CIFAR-100 in {folder} is damaged ({', '.join(bad) or error} fails its checksum). "
                f"Delete {folder} and prepare it again with:\n    {prepare_hint}") from error
        # Channels first once for the whole set (150 MB for the official training set), not per sample;
        # ``data`` stays torchvision's HWC array, now a view of the same memory.
        self.images = torch.from_numpy(self.data).permute(0, 3, 1, 2).contiguous()
        self.data = self.images.permute(0, 2, 3, 1).numpy()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        return (self.transform(image) if self.transform is not None else image), self.targets[index]
