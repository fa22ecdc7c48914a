"""Files and folders that are always whole: written under a temporary name, then renamed over the old one
(notebooks 00 and 07-10, and every run: checkpoints, the run's summary, a resumed run's metrics, generated data).

A process killed in the middle of a write, or a disk that fills up, leaves the previous file
intact, never a truncated one under the final name.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def _sync_directory(folder: Path) -> None:
    """Make renames in ``folder`` durable."""
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class _WatchedStream:
    """A file that remembers the first error of a ``write``: ``torch.save`` turns a full disk into a
    RuntimeError about zip positions, and the OSError that says what happened would be lost."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.error = stream, None

    def write(self, data: bytes) -> int:
        try:
            return self.stream.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    """Write ``path`` through ``write`` so that ``path`` is always either the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            watched = _WatchedStream(stream)
            try:
                write(watched)
            except Exception as error:
                if watched.error is None or watched.error is error:
                    raise
                raise watched.error from error
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
        _sync_directory(path.parent)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        if error.filename is None:  # a failed write() does not say which file it was writing
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """``path.write_text(text)``, whole or not at all."""
    return write_atomic(path, lambda stream: stream.write(text.encode()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def staging_folder(parent: Path, prefix: str) -> Path:
    """A new empty folder in ``parent`` named ``prefix``, this host and this process; first removes the
    folders of the same prefix that a process of this host left when it was killed (SIGKILL, the OOM
    killer: no clean-up ran), which can hold gigabytes. Another host's folders are left alone: its
    processes cannot be seen from here."""
    parent, host = Path(parent), re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())
    left = re.compile(rf"{re.escape(prefix)}{re.escape(host)}-(\d+)-\w+")
    with contextlib.suppress(OSError):
        for folder in parent.iterdir():
            match = left.fullmatch(folder.name)
            if match and not _alive(int(match.group(1))):
                shutil.rmtree(folder, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{host}-{os.getpid()}-", dir=parent))


@contextlib.contextmanager
def whole_directory(target: Path) -> Iterator[Path]:
    """An empty folder beside ``target`` to write into; when the block ends without an error it replaces
    ``target`` (whose old content is deleted), else it is removed and ``target`` stays as it was."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(target.parent, f".{target.name}-")
    try:
        yield staging
        replace_directory(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace_directory(staged: Path, target: Path) -> None:
    """Rename the finished folder ``staged`` to ``target``. An existing ``target`` is first renamed aside and
    deleted only once ``staged`` stands in its place: at every moment one whole folder is there."""
    staged, target = Path(staged), Path(target)
    if not target.exists():
        os.replace(staged, target)
        return
    replaced = target.with_name(f".{target.name}.old.tmp")
    shutil.rmtree(replaced, ignore_errors=True)
    os.replace(target, replaced)
    os.replace(staged, target)
    shutil.rmtree(replaced)
