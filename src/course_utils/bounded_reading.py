"""Another program's output, read with bounds (notebooks 08 and 12: the transport and failure readers, the
interconnect health check, the doctor's ``--log``; and ``--resume PATH``).

A path a learner gives may be anything: a FIFO, whose reader waits for a writer forever; ``/dev/zero`` (or a link to
it), which never ends; a folder; a binary file, which fails to decode half-way; a log of gigabytes, which fills the
memory when read whole; a line of a megabyte, on which a regular expression can take minutes. So a reader opens
only a regular file, says what anything else is by name, and reads the lines in a stream: each line cut to
:data:`MAX_LINE_CHARS` before any pattern reads it, the file read up to the size it had when it was opened (a log
still being written ends), and, given ``seconds``, no longer than that.
"""

from __future__ import annotations

import codecs
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

Read = TypeVar("Read")

MAX_LINE_CHARS = 4096  # a line longer than this is cut before matching (NCCL's lines are far shorter)
LINE_BYTES = 2**20  # what is read of one physical line (it may hold many \r-separated progress-bar updates)
TEXT_CHECK_BYTES = 8192  # the start of a file, which must be text
KEPT = 100  # how many of a kind of line (warnings, errors, versions) a reader keeps: a log may hold millions

KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotReadable(ValueError):
    """A path that is not a regular text file this user can read; the message names it, says why and the fix."""


def _kind(mode: int) -> str | None:
    """What a file of this mode is, in words; None for a regular file."""
    return next((words for test, words in KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is, in words ("a FIFO (named pipe)", "a folder", ...), where it is not a regular file (a link
    is what it points to); None for a regular file. OSError where it cannot be looked at."""
    return _kind(os.stat(path).st_mode)


def _owner(path: Path) -> str:
    try:
        return path.owner()
    except (OSError, KeyError):
        return "another user"


def _refused(path: Path, error: OSError, fix: str) -> NotReadable:
    if isinstance(error, FileNotFoundError):
        return NotReadable(f"{path}: no such file; {fix}")
    if isinstance(error, PermissionError):
        return NotReadable(f"{path}: permission denied (it or its folder belongs to {_owner(path)}); read it as "
                           "that user, or have them make it readable (chmod a+r), or copy it somewhere you can read")
    return NotReadable(f"{path}: cannot be read ({error.strerror}); {fix}")


def open_regular(path: str | os.PathLike, what: str = "log file",
                 fix: str = "give the file the ranks wrote") -> BinaryIO:
    """Open ``path`` for reading if it is a regular file (a link to one is one); else :class:`NotReadable` names what
    it is (``what``: what the caller reads, ``fix``: what to give instead)."""
    path = Path(path)
    try:
        found = kind(path)  # refused before it is opened: opening a device may act on it
        # O_NONBLOCK: a FIFO put in its place meanwhile opens at once instead of waiting for a writer
        descriptor = None if found else os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as error:
        raise _refused(path, error, fix) from None
    if descriptor is not None and (found := _kind(os.fstat(descriptor).st_mode)):
        os.close(descriptor)
    if found is not None:
        raise NotReadable(f"{path} is {found}, not a {what}: {fix}")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def _is_text(start: bytes) -> bool:
    """UTF-8 (a character cut at the end of ``start`` allowed) with no NUL byte in its first line; NUL bytes after
    it are a hole that a writer on a node that crashed leaves, in a text log."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(start, final=False)
    except UnicodeDecodeError:
        return False
    return b"\0" not in start.partition(b"\n")[0]


class Lines:
    """The lines of a regular text file, in a stream: each cut to :data:`MAX_LINE_CHARS`; ``\\r`` ends a line too,
    as in :meth:`str.splitlines`. Opening refuses anything else (:class:`NotReadable`); ``cut_short`` says whether
    ``seconds`` ran out before the end."""

    def __init__(self, path: str | os.PathLike, what: str = "log file", fix: str = "give the file the ranks wrote",
                 seconds: float | None = None) -> None:
        self.path = Path(path)
        self.size = 0
        self.read_bytes = 0
        self.cut_short = False
        self._seconds = seconds
        self._stream = open_regular(self.path, what, fix)
        try:
            self.size = os.fstat(self._stream.fileno()).st_size
            if not _is_text(self._stream.read(TEXT_CHECK_BYTES)):
                raise NotReadable(f"{self.path} is binary, not a text {what.removesuffix(' file')} (a NUL byte in "
                                  f"its first line, or bytes that are not UTF-8 in its first {TEXT_CHECK_BYTES} "
                                  f"bytes): {fix}")
            self._stream.seek(0)
        except BaseException:
            self._stream.close()
            raise

    def __iter__(self) -> Iterator[str]:
        deadline = None if self._seconds is None else time.monotonic() + self._seconds
        with self._stream as stream:
            inside_long_line = False  # the rest of a line longer than LINE_BYTES is skipped
            while self.read_bytes < self.size:
                if deadline is not None and time.monotonic() > deadline:
                    self.cut_short = True
                    return
                chunk = stream.readline(min(LINE_BYTES, self.size - self.read_bytes))
                if not chunk:  # the file was cut shorter meanwhile
                    return
                self.read_bytes += len(chunk)
                if not inside_long_line:
                    yield from (line[:MAX_LINE_CHARS] for line in chunk.decode(errors="replace").splitlines())
                inside_long_line = not chunk.endswith(b"\n")

    def close(self) -> None:
        self._stream.close()

    def what_was_read(self) -> str:
        """How much of the file was read, as a person reads it: '12 MB of 1.1 GB'."""
        return f"{_size(self.read_bytes)} of {_size(self.size)}"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


def cut(lines: Iterable[str]) -> Iterator[str]:
    """Lines given in memory, each cut to :data:`MAX_LINE_CHARS` as :class:`Lines` cuts those of a file."""
    return (line[:MAX_LINE_CHARS] for line in lines)


def read_for_a_command(program: str, path: Path, read: Callable[[Path], Read]) -> Read | None:
    """``read(path)`` for the command-line reader ``program``; None once it has said on stderr why the file could
    not be read (not a regular text file, or the system's refusal)."""
    try:
        return read(path)
    except NotReadable as error:
        print(f"{program}: {error}", file=sys.stderr)
    except OSError as error:
        print(f"{program}: cannot read {path} ({error.strerror})", file=sys.stderr)
    return None
