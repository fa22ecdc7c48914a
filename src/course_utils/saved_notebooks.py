"""The form in which the course's notebooks are saved: without outputs, so that running them leaves a
learner's checkout clean and ``git pull`` never conflicts (notebooks 00-08, through ``make lab``).

The repository keeps each notebook in this form; JupyterLab started by ``make lab`` puts every
notebook under ``notebooks/`` into it when it saves one (``jupyter/jupyter_server_config.py``).
Outputs are kept only in the cells whose output the test suite compares (``# NBVAL_CHECK_OUTPUT``).
"""

from __future__ import annotations

from typing import Any

CHECKED_OUTPUT = "# NBVAL_CHECK_OUTPUT"
KEPT_NOTEBOOK_METADATA = ("kernelspec",)


def course_form(notebook: dict[str, Any]) -> dict[str, Any]:
    """``notebook`` (an nbformat 4 dict, changed in place and returned) as the repository keeps it."""
    metadata = notebook.get("metadata", {})
    notebook["metadata"] = {key: metadata[key] for key in KEPT_NOTEBOOK_METADATA if key in metadata}
    notebook["metadata"]["language_info"] = {"name": "python"}
    for cell in notebook.get("cells", []):
        cell["metadata"] = {}
        if cell["cell_type"] != "code":
            continue
        cell["execution_count"] = None
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if not source.startswith(CHECKED_OUTPUT):
            cell["outputs"] = []
        for output in cell["outputs"]:
            if "execution_count" in output:
                output["execution_count"] = None
    return notebook


def pre_save_hook(model: dict[str, Any], path: str, contents_manager: Any = None, **kwargs: Any) -> None:
    """Jupyter's ``FileContentsManager.pre_save_hook``: the course's notebooks are saved in their form."""
    if model.get("type") == "notebook" and path.lstrip("/").startswith("notebooks/"):
        course_form(model["content"])
