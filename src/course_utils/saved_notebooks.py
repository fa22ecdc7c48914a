"""The form in which the course's notebooks are saved: without outputs, so that running them leaves a
learner's checkout clean and ``git pull`` never conflicts (notebooks 00-08, through ``make lab``).

The repository keeps each notebook in this form; JupyterLab started by ``make lab`` puts every
notebook under ``notebooks/`` into it when it saves one (``jupyter/jupyter_server_config.py``).
Outputs are kept only in the cells whose output the test suite compares (``# NBVAL_CHECK_OUTPUT``);
those carry execution count 1, since nbval compares only cells that have one, and a fixed count keeps
the saved file the same however often the cell ran.
"""

from __future__ import annotations

import json
from typing import Any

from course_utils import config

CHECKED_OUTPUT = "# NBVAL_CHECK_OUTPUT"
CHECKED_COUNT = 1
KEPT_NOTEBOOK_METADATA = ("kernelspec",)
# A cell keeps its tags (the exercises' and solutions' names, which the tests find cells by) and Jupyter's
# own display state (a solution's source hidden until the learner opens it); the rest is editor state.
KEPT_CELL_METADATA = ("tags", "jupyter")


def course_form(notebook: dict[str, Any]) -> dict[str, Any]:
    """``notebook`` (an nbformat 4 dict, changed in place and returned) as the repository keeps it."""
    metadata = notebook.get("metadata", {})
    notebook["metadata"] = {key: metadata[key] for key in KEPT_NOTEBOOK_METADATA if key in metadata}
    notebook["metadata"]["language_info"] = {"name": "python"}
    for cell in notebook.get("cells", []):
        cell["metadata"] = {key: cell["metadata"][key] for key in KEPT_CELL_METADATA if key in cell.get("metadata", {})}
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        checked = source.startswith(CHECKED_OUTPUT)
        cell["execution_count"] = CHECKED_COUNT if checked else None
        if not checked:
            cell["outputs"] = []
        for output in cell["outputs"]:
            if "execution_count" in output:
                output["execution_count"] = CHECKED_COUNT
    return notebook


def pre_save_hook(model: dict[str, Any], path: str, contents_manager: Any = None, **kwargs: Any) -> None:
    """Jupyter's ``FileContentsManager.pre_save_hook``: the course's notebooks are saved in their form."""
    if model.get("type") == "notebook" and path.lstrip("/").startswith("notebooks/"):
        course_form(model["content"])


def shipped_code_cells(notebook: str) -> list[str]:
    """The source of every code cell of ``notebooks/NOTEBOOK``, read from the checkout's file: as the course
    ships it, or as the learner last saved it there (a saved notebook keeps its code, only its outputs go)."""
    path = config.checkout_root() / "notebooks" / notebook
    return ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]
