"""Is a person watching? Live views and servers start only in a live Jupyter front-end."""

from __future__ import annotations

import os
import sys

INTERACTIVE_VARIABLE = "COURSE_INTERACTIVE"


def interactive() -> bool:
    """True in a live Jupyter kernel; False in nbval, CI and scripts.

    ``COURSE_INTERACTIVE=0`` (the test configuration sets it) or ``CI=true`` switch it off.
    """
    if os.environ.get(INTERACTIVE_VARIABLE, "1") == "0" or os.environ.get("CI", "").lower() == "true":
        return False
    return "ipykernel" in sys.modules
