"""Checkpoints written so that nothing is lost: a temporary file, fsync, then an atomic rename
(notebooks 07-08, and every run that checkpoints).

A run killed in the middle of a write leaves the previous checkpoint intact, never a truncated
file under the final name. A run keeps its last K checkpoints as ``step-NNNNNNNN.pt`` and
``last.pt``, a copy of the newest: independent files, so that damage to one (a disk error, a
file overwritten in place) leaves the others to resume from. Loading uses ``weights_only=True``:
a checkpoint is data, not code; a file that is not a whole checkpoint raises
:class:`DamagedCheckpoint`, which names it.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from course_utils.run_folder import LAST_CHECKPOINT


class DamagedCheckpoint(RuntimeError):
    """A file that is not a whole checkpoint: truncated, overwritten, or holding more than data."""


def _sync_directory(folder: Path) -> None:
    """Make renames in ``folder`` durable."""
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    """Write ``path`` through ``write`` so that ``path`` is always either the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
        _sync_directory(path.parent)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def save_atomic(state: dict[str, Any], path: Path) -> Path:
    """Write ``state`` to ``path`` so that ``path`` is always either the old or the new file."""
    return _write_atomic(path, lambda stream: torch.save(state, stream))


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint without executing anything from it; :class:`DamagedCheckpoint` names a bad file."""
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError, zipfile.BadZipFile) as error:
        if str(error).startswith("Weights only load failed"):  # never load such a file another way
            raise DamagedCheckpoint(f"{path} holds objects other than tensors and numbers; it was not loaded, "
                                    "since loading it could run code") from error
        raise DamagedCheckpoint(f"{path} is damaged: {path.stat().st_size} bytes that are not a whole PyTorch "
                                "checkpoint (truncated or overwritten)") from error
    if not isinstance(state, dict) or "model" not in state:
        raise DamagedCheckpoint(f"{path} is not a checkpoint of this course's training command (no model state)")
    return state


def step_path(folder: Path, step: int) -> Path:
    return Path(folder) / f"step-{step:08d}.pt"


def save_keeping(state: dict[str, Any], folder: Path, step: int, keep: int = 2) -> Path:
    """Write the checkpoint of ``step``, copy it to ``last.pt``, and delete all but the newest ``keep``
    step files. Each move is atomic: a kill at any moment leaves a loadable ``last.pt``."""
    if keep < 1:
        raise ValueError(f"--keep-checkpoints must be at least 1, not {keep}")
    folder = Path(folder)
    path = save_atomic(state, step_path(folder, step))
    with open(path, "rb") as source:
        _write_atomic(folder / LAST_CHECKPOINT, lambda stream: shutil.copyfileobj(source, stream))
    for old in sorted(folder.glob("step-*.pt"))[:-keep]:
        old.unlink()
    return path


def candidates(folder: Path) -> list[Path]:
    """The checkpoints in ``folder``, newest first: ``last.pt``, then the step files."""
    folder = Path(folder)
    last = [folder / LAST_CHECKPOINT] if (folder / LAST_CHECKPOINT).is_file() else []
    return last + sorted(folder.glob("step-*.pt"), reverse=True)


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
