"""Files and folders the course makes in folders others may write in, never through a link planted there
(notebooks 01-10: every run's folder, a class's shared data root).

A run folder in a project's shared space, or a data root a class shares, can be writable by other users. A
symbolic link planted under a name the course writes (``.hold``, ``metrics.jsonl``, ``checkpoints``...) would
make the next run write wherever it points, with its owner's rights: over their ``~/.ssh/authorized_keys``, say.
So the course opens such files with ``O_NOFOLLOW`` (or makes them new, with ``O_EXCL``), refuses a file that has
other names (a planted hard link), makes its folders and refuses one that is a link; a file written whole goes
through :func:`course_utils.atomic_files.write_atomic`, whose rename replaces a link without following it.
The folder a person names (``--out``, ``--data-dir``) may itself be a link: that is their choice.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO


class PlantedLink(OSError):
    """A link, or another kind of file, where the course creates its own: nothing was written through it."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(errno.ELOOP, f"{path} is {what}, where the course writes a file of its own; nothing was "
                         "written through it, since whoever put it there could make this run overwrite any file "
                         f"you can write. Remove it (rm {path}), check who else can write in {path.parent}, or "
                         "choose another folder")


def _planted(path: Path) -> str:
    target = os.readlink(path)
    return f"a symbolic link (to {target})"


def refuse_link(path: Path) -> Path:
    """``path``, after checking that it is not a symbolic link."""
    path = Path(path)
    if path.is_symlink():
        raise PlantedLink(path, _planted(path))
    return path


def make_folder(path: Path) -> Path:
    """Make the folder ``path`` (and its parents) unless it is there; refuse it when it is a link."""
    path = Path(path)
    refuse_link(path)
    path.mkdir(parents=True, exist_ok=True)
    return refuse_link(path)


def new_folder(path: Path) -> Path:
    """Make a folder that no other process has: ``path``, or else ``path-2``, ``path-3``... (its parents as needed).
    ``mkdir`` makes a folder only where there is none, so processes that propose one name at once get one each."""
    path = candidate = Path(path)
    for number in itertools.count(2):
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            candidate = path.with_name(f"{path.name}-{number}")


def open_file(path: Path, mode: str = "w") -> IO:
    """``open(path, mode)`` for ``w``, ``a`` and ``a+`` (with ``b`` for bytes), without following a link: ``w``
    makes a new file in place of the old one (its old content is never written over in place), ``a`` and ``a+``
    open the file there only when it is a regular file with no other name (a planted hard link)."""
    path = Path(path)
    if mode.replace("b", "") not in ("w", "a", "a+"):
        raise ValueError(f"open_file: mode {mode!r} is not w, a or a+")
    flags = os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)  # Windows has neither
    flags |= os.O_RDWR if "+" in mode else os.O_WRONLY
    if mode.startswith("w"):
        flags |= os.O_EXCL
        if path.is_symlink():
            raise PlantedLink(path, _planted(path))
        path.unlink(missing_ok=True)
    else:
        flags |= os.O_APPEND
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise PlantedLink(path, _planted(path) if path.is_symlink() else "not a regular file")
    try:
        handle = os.open(path, flags, 0o666)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EEXIST) and path.is_symlink():  # planted since the check above
            raise PlantedLink(path, _planted(path)) from error
        raise
    status = os.fstat(handle)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(handle)
        raise PlantedLink(path, "a file with other names (a hard link)" if stat.S_ISREG(status.st_mode)
                          else "not a regular file")
    return os.fdopen(handle, mode)


@contextlib.contextmanager
def naming_the_file(path: Path) -> Iterator[None]:
    """Give an OSError of a write (a full disk), which names no file, the name of ``path``."""
    try:
        yield
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error
