"""One run at a time in a run folder (every run of the training command, notebooks 01-08 and the jobs).

Two runs with the same ``--out`` would interleave their metrics and checkpoints and leave a folder
that can be neither read nor resumed. Rank 0 therefore holds an exclusive POSIX lock (``lockf``)
on the folder's ``.hold`` file while it runs. The operating system releases it when the process
ends, however it ends, so a run that was killed leaves no stale hold behind; unlike ``flock``, the
lock belongs to the process alone, not to the DataLoader workers it forks, which may outlive it by
a few seconds. Network file systems (NFS, Lustre) pass such locks to their lock manager; where a
file system has no locks, the run says so and goes on unprotected. A link planted under one of the names the
course writes in the folder stops the run before anything is written (:mod:`course_utils.shared_folders`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
import warnings
from collections.abc import Iterator
from typing import IO

from course_utils.parallel.collectives import from_rank_zero
from course_utils.run_folder import RunFolder
from course_utils.shared_folders import open_file, refuse_link


class FolderInUse(RuntimeError):
    """Another run holds this run folder; the message names it and what to do."""


class FolderHold:
    """The exclusive hold of one run folder, from ``__enter__`` to ``__exit__``."""

    def __init__(self, folder: RunFolder) -> None:
        self.folder = folder
        self._file: IO[str] | None = None

    def __enter__(self) -> FolderHold:
        self.folder.path.mkdir(parents=True, exist_ok=True)
        for path in self.folder.own_paths:  # before the run reads or writes any of them
            refuse_link(path)
        stream = open_file(self.folder.hold, "a+")
        try:
            fcntl.lockf(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EAGAIN):
                stream.seek(0)
                holder = stream.read().strip() or "another process"
                stream.close()
                raise FolderInUse(f"{self.folder.path} is in use by {holder}: wait for that run to end, or "
                                  "choose another --out") from None
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                stream.close()
                raise
            warnings.warn(f"{self.folder.path}: this file system has no locks, so nothing stops a second run "
                          "in this folder while this one runs", stacklevel=2)
        stream.seek(0)
        stream.truncate()
        stream.write(f"the run of process {os.getpid()} on {socket.gethostname()} (started "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        stream.flush()
        self._file = stream
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()  # closing releases the lock
            self._file = None


@contextlib.contextmanager
def held_by_rank_zero(folder: RunFolder, is_main: bool) -> Iterator[None]:
    """Rank 0 holds ``folder`` (call on every rank, before anything reads the folder's checkpoints): when it
    cannot, every rank stops with its reason, instead of waiting for it at the first collective."""
    hold, refusal = FolderHold(folder), None
    if is_main:
        try:
            hold.__enter__()
        except (FolderInUse, OSError) as error:
            refusal = error
    refused = from_rank_zero(None if refusal is None else str(refusal))
    if refusal is not None:
        raise refusal
    if refused is not None:
        raise FolderInUse(refused)
    try:
        yield
    finally:
        hold.__exit__()
