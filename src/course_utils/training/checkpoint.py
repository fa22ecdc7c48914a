"""Checkpoints written so that nothing is lost (notebooks 07-09, and every run that checkpoints).

Each is written whole or not at all (:mod:`course_utils.atomic_files`): a run killed in the middle
of a write, or a full disk, leaves the previous checkpoint intact. A run keeps its last K
checkpoints as ``step-NNNNNNNN.pt`` and ``last.pt``, a copy of the newest: independent files, so
that damage to one (a disk error, a file overwritten in place) leaves the others to resume from.
Loading uses ``weights_only=True``: a checkpoint is data, not code; a file that is not a whole
checkpoint raises :class:`DamagedCheckpoint`, which names it.

An FSDP run's checkpoint is a folder, ``step-NNNNNNNN.dcp``, of every rank's shards with the rest of
the run's state in ``extra.pt`` (:mod:`course_utils.training.sharded_checkpoint` writes and reads
the shards); both layouts share the names, the order and the clean-up below. A sharded one is whole
when its metadata reads as data and every shard file it names is there at its full length
(:mod:`course_utils.training.shard_files`); its items are read as data only.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from course_utils import bounded_reading
from course_utils.atomic_files import write_atomic
from course_utils.run_folder import LAST_CHECKPOINT
from course_utils.shared_folders import PlantedLink, make_folder
from course_utils.training import shard_files

SHARDED_SUFFIX = ".dcp"  # a folder of shards written by torch.distributed.checkpoint
SHARDED_EXTRA = "extra.pt"  # in that folder: everything but the model and optimizer
SHARDED_METADATA = shard_files.METADATA  # in that folder: written last, when every rank's shards are in place


# How PyTorch's weights-only unpickler names what it refused to import ("Unsupported global: GLOBAL os.system" in
# PyTorch 2.4-2.5, "Trying to load unsupported GLOBAL posix.system whose module posix is blocked" since 2.6).
REFUSED_GLOBAL = "GLOBAL "


class DamagedCheckpoint(RuntimeError):
    """A file that is not a whole checkpoint: truncated, overwritten, or holding more than data."""


def save_atomic(state: dict[str, Any], path: Path) -> Path:
    """Write ``state`` to ``path`` so that ``path`` is always either the old or the new file."""
    return write_atomic(path, lambda stream: torch.save(state, stream))


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint into host memory without executing anything from it; :class:`DamagedCheckpoint`
    names a bad file.
    Of a sharded checkpoint (a folder) this reads all but the shards: see :mod:`.sharded_checkpoint`."""
    path = Path(path)
    if path.is_dir():
        wrong = shard_files.problems(path) + ([] if (path / SHARDED_EXTRA).is_file() else
                                              [f"its {SHARDED_EXTRA} is missing"])
        if wrong:
            raise DamagedCheckpoint(f"{path} is not a whole sharded checkpoint: {'; '.join(wrong)}")
        return _read(path / SHARDED_EXTRA, must_hold="step")
    return _read(path, must_hold="model")


def _read(path: Path, must_hold: str) -> dict[str, Any]:
    if (kind := bounded_reading.kind(path)) is not None:  # a FIFO would hold the run waiting for a writer for ever
        raise DamagedCheckpoint(f"{path} is {kind}, not a checkpoint file: give --resume a checkpoint file (such "
                                f"as OUT/checkpoints/{LAST_CHECKPOINT}), a sharded checkpoint's folder, or auto")
    damaged = (f"{path} is damaged: {path.stat().st_size} bytes that are not a whole PyTorch checkpoint (truncated, "
               "overwritten, or not a checkpoint at all)")
    if not zipfile.is_zipfile(path):  # what torch.save writes; anything else is not unpickled at all
        raise DamagedCheckpoint(damaged)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except pickle.UnpicklingError as error:
        if REFUSED_GLOBAL in str(error):  # a reference to code: never load such a file another way
            raise DamagedCheckpoint(f"{path} holds objects other than tensors and numbers; it was not loaded, "
                                    "since loading it could run code") from error
        raise DamagedCheckpoint(damaged) from error
    except Exception as error:  # a damaged archive fails in many ways: EOFError, KeyError, IndexError...
        raise DamagedCheckpoint(damaged) from error
    if not isinstance(state, dict) or must_hold not in state:
        raise DamagedCheckpoint(f"{path} is not a checkpoint of this course's training command (no {must_hold})")
    return state


def step_path(folder: Path, step: int, sharded: bool = False) -> Path:
    return Path(folder) / f"step-{step:08d}{SHARDED_SUFFIX if sharded else '.pt'}"


def _step_checkpoints(folder: Path) -> list[Path]:
    """The step checkpoints in ``folder``, files and sharded folders, oldest first."""
    return sorted([*Path(folder).glob("step-*.pt"), *Path(folder).glob(f"step-*{SHARDED_SUFFIX}")],
                  key=lambda path: path.name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():  # a link goes, not what it points to
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def remove_oldest(folder: Path, written: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step checkpoints up to ``written``, the one just saved. Those of later
    steps are ones a resume passed over as damaged: counted, they would push out the whole ones it resumed from
    and ``written`` itself."""
    up_to_written = [path for path in _step_checkpoints(folder) if _step_name(path) <= _step_name(written)]
    for old in up_to_written[:-keep]:
        _remove(old)


def _step_name(path: Path) -> str:
    """``step-00000012`` of a step file or sharded folder: names that sort as their steps do."""
    return path.name.split(".")[0]


def save_keeping(state: dict[str, Any], folder: Path, step: int, keep: int = 2) -> Path:
    """Write the checkpoint of ``step``, copy it to ``last.pt``, and delete all but the newest ``keep``
    step files. Each move is atomic: a kill at any moment leaves a loadable ``last.pt``."""
    folder = Path(folder)
    path = save_atomic(state, step_path(folder, step))
    with open(path, "rb") as source:
        write_atomic(folder / LAST_CHECKPOINT, lambda stream: shutil.copyfileobj(source, stream))
    remove_oldest(folder, path, keep)
    return path


def check_writable(folder: Path) -> None:
    """Fail before the first step, not at the first checkpoint, when ``folder`` cannot take checkpoints."""
    folder = Path(folder)
    try:
        make_folder(folder)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except PlantedLink:
        raise
    except OSError as error:
        raise OSError(error.errno, f"checkpoints cannot be written in {folder} ({error.strerror}); make it a "
                      "writable folder or choose another --out") from error


def candidates(folder: Path) -> list[Path]:
    """The checkpoints in ``folder``, newest first: ``last.pt``, then the step files."""
    folder = Path(folder)
    last = [folder / LAST_CHECKPOINT] if (folder / LAST_CHECKPOINT).is_file() else []
    return last + _step_checkpoints(folder)[::-1]


def remove_partial(folder: Path) -> list[Path]:
    """Delete the temporary files (and shard folders) of writes that were killed half-way (call before
    writing again)."""
    partial = sorted(Path(folder).glob(".*.tmp"))
    for path in partial:
        _remove(path)
    return partial


def remove_all(folder: Path) -> list[Path]:
    """Delete every checkpoint in ``folder`` (a new run replacing an old one); returns what was there."""
    found = _step_checkpoints(folder) + sorted(Path(folder).glob(LAST_CHECKPOINT))
    for path in found:
        _remove(path)
    return found
