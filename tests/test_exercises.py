"""Every code exercise of the notebooks works: its committed cell leaves the check "not yet", and the
collapsed solution, put in its place, makes the check say "done". The cells run as a learner runs them, in
one Jupyter kernel: the notebook's first code cell (its imports), the cells the exercises need (tagged
``exercise-context``), the exercise or its solution, and the check."""

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9]*.ipynb"))
SOLUTION = re.compile(r"<details><summary>Solution (\d+)</summary>\s*```python\n(.*?)```", re.S)


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _tagged(cells: list[dict], tag: str) -> list[dict]:
    return [cell for cell in cells if tag in cell.get("metadata", {}).get("tags", [])]


def _exercises() -> list[tuple[Path, str]]:
    found = []
    for notebook in NOTEBOOKS:
        cells = json.loads(notebook.read_text())["cells"]
        found += [(notebook, number) for cell in cells if cell["cell_type"] == "markdown"
                  for number, _ in SOLUTION.findall(_source(cell))]
    return found


def _run(notebook: Path, number: str, solved: bool) -> str:
    """The check's output after the exercise cell, or its solution, ran in a fresh kernel."""
    cells = json.loads(notebook.read_text())["cells"]
    first = next(cell for cell in cells if cell["cell_type"] == "code")
    solution = dict(SOLUTION.findall("".join(_source(c) for c in cells if c["cell_type"] == "markdown")))[number]
    exercise = _source(_tagged(cells, f"exercise-{number}")[0])
    sources = [_source(first)] + [_source(cell) for cell in _tagged(cells, "exercise-context")]
    sources += [solution if solved else exercise, _source(_tagged(cells, f"check-{number}")[0]) + "\ncheck.done"]
    built = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    NotebookClient(built, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}}
                   ).execute()
    outputs = built.cells[-1].outputs
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs
                   if o.get("name") != "stderr")  # PyTorch's warnings are not the check's verdict


def test_every_notebook_from_01_to_05_has_a_code_exercise():
    numbered = {notebook.name[:2] for notebook, _ in _exercises()}
    assert {"01", "02", "03", "04", "05"} <= numbered


@pytest.mark.parametrize("notebook, number", _exercises(), ids=lambda value: getattr(value, "stem", value))
def test_the_solution_does_what_the_exercise_asks_and_the_committed_cell_does_not(notebook, number, monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "ci")
    solved = _run(notebook, number, solved=True)
    assert solved.startswith("Done: ") and solved.rstrip().endswith("True"), solved
    untouched = _run(notebook, number, solved=False)
    assert untouched.startswith("Not yet: ") and untouched.rstrip().endswith("False"), untouched
