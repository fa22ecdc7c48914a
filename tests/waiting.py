"""Waiting for a process a test started: ``Popen`` returns mid-exec, before the new program's command line and
environment are laid out (``/proc`` shows none, or the parent's, until then), and a fixed sleep is no promise on a
busy machine. A test waits for what it will read instead."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], what: str, timeout: float = 60.0, interval: float = 0.05) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:.0f} s"
        time.sleep(interval)
