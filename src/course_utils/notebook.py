"""Is this a notebook, and is a person watching it? (notebooks 01-02, and every progress bar)

Live views and servers start only in a live Jupyter front-end; progress bars redraw often in a
notebook or on a terminal and seldom in a log file.
"""

from __future__ import annotations

import os
import sys

INTERACTIVE_VARIABLE = "COURSE_INTERACTIVE"


def in_notebook() -> bool:
    """True inside a Jupyter kernel, watched or not (nbval runs one too)."""
    return "ipykernel" in sys.modules


def interactive() -> bool:
    """True in a live Jupyter kernel; False in nbval, CI and scripts.

    ``COURSE_INTERACTIVE=0`` (the test configuration sets it) or ``CI=true`` switch it off.
    """
    if os.environ.get(INTERACTIVE_VARIABLE, "1") == "0" or os.environ.get("CI", "").lower() == "true":
        return False
    return in_notebook()
