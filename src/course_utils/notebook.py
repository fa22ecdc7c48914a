"""Is this a notebook, is a person watching it, and the code a lesson is about (notebooks 01-08, and every
progress bar).

Live views and servers start only in a live Jupyter front-end; progress bars redraw often in a
notebook or on a terminal and seldom in a log file. :func:`show_code` renders the source of the
package's functions in a notebook: the PyTorch lines a lesson teaches, from the code that ran.
"""

from __future__ import annotations

import inspect
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

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


def _block(title: str, text: str, language: str) -> str:
    return f"**{title}**\n\n```{language}\n{text.rstrip()}\n```"


def code_markdown(*objects: Any) -> str:
    """Markdown with the source of each function, class or method, titled with where it lives."""
    blocks = []
    for obj in objects:
        module = inspect.getmodule(obj).__name__
        blocks.append(_block(f"{module}.{obj.__qualname__}", textwrap.dedent(inspect.getsource(obj)), "python"))
    return "\n\n".join(blocks)


def show_code(*objects: Any, files: tuple[str | Path, ...] = ()) -> Any:
    """Render the source of ``objects`` (and of text ``files``, such as job scripts) in the notebook, so
    that a learner reads, and can copy, exactly what ran; no second copy to drift from it."""
    from IPython.display import Markdown

    parts = [code_markdown(*objects)] if objects else []
    for path in map(Path, files):
        parts.append(_block(str(path), path.read_text(), "bash" if path.suffix in (".sh", ".sbatch") else ""))
    return Markdown("\n\n".join(parts))
