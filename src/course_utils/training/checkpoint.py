"""Checkpoints written so that nothing is lost (notebooks 07-08, and every run that checkpoints).

Each is written whole or not at all (:mod:`course_utils.atomic_files`): a run killed in the middle
of a write, or a full disk, leaves the previous checkpoint intact. A run keeps its last K
checkpoints as ``step-NNNNNNNN.pt`` and ``last.pt``, a copy of the newest: independent files, so
that damage to one (a disk error, a file overwritten in place) leaves the others to resume from.
Loading uses ``weights_only=True``: a checkpoint is data, not code; a file that is not a whole
checkpoint raises :class:`DamagedCheckpoint`, which names it.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from course_utils.atomic_files import write_atomic
from course_utils.run_folder import LAST_CHECKPOINT


class DamagedCheckpoint(RuntimeError):
    """A file that is not a whole checkpoint: truncated, overwritten, or holding more than data."""


def save_atomic(state: dict[str, Any], path: Path) -> Path:
    """Write ``state`` to ``path`` so that ``path`` is always either the old or the new file."""
    return write_atomic(path, lambda stream: torch.save(state, stream))


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
    folder = Path(folder)
    path = save_atomic(state, step_path(folder, step))
    with open(path, "rb") as source:
        write_atomic(folder / LAST_CHECKPOINT, lambda stream: shutil.copyfileobj(source, stream))
    for old in sorted(folder.glob("step-*.pt"))[:-keep]:
        old.unlink()
    return path


def check_writable(folder: Path) -> None:
    """Fail before the first step, not at the first checkpoint, when ``folder`` cannot take checkpoints."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise OSError(error.errno, f"checkpoints cannot be written in {folder} ({error.strerror}); make it a "
                      "writable folder or choose another --out") from error


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
