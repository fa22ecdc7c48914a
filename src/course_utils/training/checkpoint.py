"""Checkpoints written so that nothing is lost: a temporary file, fsync, then an atomic rename
(notebooks 07-08, and every run that checkpoints).

A run killed in the middle of a write leaves the previous checkpoint intact, never a truncated
file under the final name. A run keeps its last K checkpoints as ``step-NNNNNNNN.pt`` and
``last.pt``, a hard link to the newest. Loading uses ``weights_only=True``: a checkpoint is data,
not code.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from course_utils.run_folder import LAST_CHECKPOINT


def _sync_directory(folder: Path) -> None:
    """Make renames in ``folder`` durable."""
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def save_atomic(state: dict[str, Any], path: Path) -> Path:
    """Write ``state`` to ``path`` so that ``path`` is always either the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(state, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
        _sync_directory(path.parent)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint without executing anything from it."""
    return torch.load(Path(path), map_location=map_location, weights_only=True)


def step_path(folder: Path, step: int) -> Path:
    return Path(folder) / f"step-{step:08d}.pt"


def save_keeping(state: dict[str, Any], folder: Path, step: int, keep: int = 2) -> Path:
    """Write the checkpoint of ``step``, make ``last.pt`` point at it, and delete all but the newest
    ``keep`` step files. Each move is atomic: a kill at any moment leaves a loadable ``last.pt``."""
    if keep < 1:
        raise ValueError(f"--keep-checkpoints must be at least 1, not {keep}")
    folder = Path(folder)
    path = save_atomic(state, step_path(folder, step))
    link = folder / f".{LAST_CHECKPOINT}.{os.getpid()}.tmp"
    link.unlink(missing_ok=True)
    try:
        os.link(path, link)  # no second copy of the bytes
    except OSError:  # file systems without hard links
        shutil.copyfile(path, link)
    os.replace(link, folder / LAST_CHECKPOINT)
    _sync_directory(folder)
    for old in sorted(folder.glob("step-*.pt"))[:-keep]:
        old.unlink()
    return path


def latest(folder: Path) -> Path | None:
    """The newest checkpoint in ``folder``: ``last.pt``, else the newest step file, else None."""
    folder = Path(folder)
    if (folder / LAST_CHECKPOINT).is_file():
        return folder / LAST_CHECKPOINT
    steps = sorted(folder.glob("step-*.pt"))
    return steps[-1] if steps else None


def remove_partial(folder: Path) -> list[Path]:
    """Delete the temporary files of writes that were killed half-way (call before writing again)."""
    partial = sorted(Path(folder).glob(".*.tmp"))
    for path in partial:
        path.unlink(missing_ok=True)
    return partial


def remove_all(folder: Path) -> list[Path]:
    """Delete every checkpoint in ``folder`` (a new run replacing an old one); returns what was there."""
    found = sorted(Path(folder).glob("step-*.pt")) + sorted(Path(folder).glob(LAST_CHECKPOINT))
    for path in found:
        path.unlink()
    return found
