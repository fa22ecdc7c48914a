"""How every data_prep command ends when its job is stopped or the file system refuses.

SIGTERM (Slurm's ``scancel`` and time limit) runs the same clean-up as Ctrl-C, so a stopped extraction
leaves no staging folder behind; a full disk, a read-only file system, a folder without write permission
or a file where a folder belongs is one line that names the fix, not a traceback, met at the first write
(before any download or extraction). What was finished before stays, and running the same command again
continues from it.
"""

from __future__ import annotations

import errno
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from course_utils import config
from course_utils.shared_folders import PlantedLink

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# The file system's refusals: the fix is another folder or more room, never another download.
REFUSALS = (*DISK_FULL, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST)


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` is the file system (or the course, at a planted link) refusing a write, not a damaged
    archive or a lost connection."""
    return isinstance(error, PlantedLink) or (isinstance(error, OSError) and error.errno in REFUSALS)


def _room(path: Path) -> str:
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            free = shutil.disk_usage(candidate).free
            amount = f"{free / 1e9:.1f} GB" if free >= 1e9 else f"{free / 1e6:.1f} MB"
            return f"{amount} free on that file system"
    return "no room left"


def _root_fix(chosen_by: str) -> str:
    """How to choose another folder: the command's ``--root``, or the variable the folder came from."""
    if chosen_by == config.DATA_VARIABLE:
        return config.point_elsewhere(chosen_by)
    return f"choose another {chosen_by}"


def explain(error: OSError, root: Path, chosen_by: str = "--root") -> str | None:
    """One line for a refusal of the file system while preparing data in ``root``, which ``chosen_by`` (an
    option or a variable) chose; None for other errors."""
    if not is_refusal(error):
        return None
    if isinstance(error, PlantedLink):
        return error.strerror
    path = Path(error.filename) if error.filename else Path(root)
    misfit = config.folder_misfit(path, _root_fix(chosen_by))
    if error.errno in (errno.ENOTDIR, errno.EEXIST) and misfit is not None:
        return misfit
    if error.errno in DISK_FULL:
        return (f"disk full writing {path} ({_room(path)}): free space, or {_root_fix(chosen_by)} on a larger file "
                f"system, then run the same command again; what was finished is kept")
    if error.errno == errno.EROFS:
        return (f"{path} is on a read-only file system: {_root_fix(chosen_by)} on a writable one (on LUMI, "
                f"project scratch)")
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"no permission to write {path}: {_root_fix(chosen_by)} that you may write to, or ask its owner"
    return None


def check_writable(root: Path) -> None:
    """Make ``root`` (and its parents) and write a file there, so that a folder which cannot take the data
    is refused before anything is downloaded or extracted."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=root):  # a new file of a name nobody knows in advance
        pass


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


_guarding = False  # a command that runs another (data_prep's course-wide one) speaks for both


def run(work: Callable[[], int], root: Path, chosen_by: str = "--root", probe_first: bool = False) -> int:
    """Run ``work`` (a command's body, returning its exit status) with SIGTERM handled as Ctrl-C and the file
    system's refusals in ``root`` (chosen by ``chosen_by``) turned into one line; a stop returns 128 + the
    signal's number. ``probe_first``: write a file in ``root`` before ``work``, for a command that computes a
    while before its first write; otherwise that first write is the check, so that a finished tree on a
    read-only file system (a class's shared copy) is verified and left as it is."""
    global _guarding
    if _guarding:
        return work()
    previous, _guarding = signal.signal(signal.SIGTERM, _stop), True
    try:
        if probe_first:
            check_writable(root)
        return work()
    except KeyboardInterrupt as stop:
        name = str(stop) or "SIGINT"
        print(f"stopped by {name}: no half-extracted folder is left and what was finished is kept; the same "
              f"command continues from it", file=sys.stderr)
        return 128 + signal.Signals[name].value
    except OSError as error:
        message = explain(error, root, chosen_by)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        _guarding = False
