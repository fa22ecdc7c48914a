"""Each experiment's design is written once, in the notebook cell where the learner edits it (notebook 05's
stages, notebook 09's rungs); the package's defaults and the benchmark that records the same experiment on a GPU
node read it from the checkout's notebook: as the course ships it, or with the rows a learner added and saved.
"""

from __future__ import annotations

import ast
from typing import Any

from course_utils.saved_notebooks import shipped_code_cells


def _parsed(source: str) -> ast.Module | None:
    """A cell's code, or None for a cell that is not plain Python (a cell magic such as ``%%writefile``)."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def notebook_design(notebook: str, name: str, namespace: dict[str, Any]) -> Any:
    """The value that the shipped ``notebooks/NOTEBOOK`` assigns to ``name`` at a code cell's top level
    (``stages = [...]``), evaluated with ``namespace``: the names its expression uses, and nothing else of the
    cell."""
    for source in shipped_code_cells(notebook):
        for node in getattr(_parsed(source), "body", []):
            if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name for target in node.targets):
                return eval(compile(ast.Expression(node.value), f"notebooks/{notebook}", "eval"), dict(namespace))
    raise LookupError(f"no code cell of notebooks/{notebook} assigns {name}")
