"""The package's house rules: no import cycles, lower floors never import upper ones, every module says
what it is for and which notebooks use it; every notebook ends with its self-check."""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "course_utils"
# Each part of the package may import its own floor and the floors below it, never one above.
FLOORS = {
    "atomic_files": 0, "config": 0, "devices": 0, "notebook": 0, "run_folder": 0, "saved_notebooks": 0,
    "shared_folders": 0, "versions": 0, "bounded_reading": 0,
    "data": 1, "observe": 1, "parallel": 1,
    "training": 2,
    "train": 3, "doctor": 3,
    "experiments": 4, "tooling": 4,
    "lessons": 5,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _modules() -> dict[str, ast.Module]:
    return {_module_name(path): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The package's modules that ``tree`` imports, wherever the import stands (lazy ones count too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("course_utils"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("course_utils"))
    return {name for name in found if name in modules}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(tree, set(modules)) - {name} for name, tree in modules.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "course_utils"


def test_the_package_has_no_import_cycles():
    graph, state, cycles = _graph(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                cycles.append(path[path.index(imported):] + [imported])
            elif imported not in state:
                visit(imported, path + [imported])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_no_floor_imports_a_floor_above_it():
    upward = [f"{module} -> {imported}" for module, imports in _graph().items() for imported in imports
              if _part(module) in FLOORS and FLOORS[_part(imported)] > FLOORS[_part(module)]]
    assert not upward, "imports from a higher floor: " + "; ".join(upward)


def test_every_part_of_the_package_has_a_floor():
    assert {_part(module) for module in _graph()} - {"course_utils"} <= set(FLOORS)


def _imported_at_start(tree: ast.Module) -> set[str]:
    """The modules a module's own top-level statements import (not those under ``if TYPE_CHECKING:``, nor those
    inside functions), each with the packages above it."""
    names, pending = set(), list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            pending += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                        *(statement for handler in getattr(node, "handlers", []) for statement in handler.body)]
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {".".join(name.split(".")[:end]) for name in names for end in range(1, name.count(".") + 2)}


def test_the_training_commands_ranks_start_without_pandas():
    """Every rank of every launch imports ``course_utils.train``: pandas, 0.7 s of CPU in each, is imported where
    a table is made, which a training run does not need."""
    modules, seen, pending, outside = _modules(), set(), ["course_utils.train"], {}
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imported_at_start(modules[module]):
            if name in modules:
                pending.append(name)
            elif name.split(".")[0] != "course_utils":  # not a module: a name imported from one
                outside.setdefault(name.split(".")[0], module)
    assert "course_utils.observe.metrics" in seen and "torch" in outside  # the walk follows the real imports
    assert "pandas" not in outside, f"{outside.get('pandas')} imports pandas when the training command starts"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_each_module_says_what_it_is_for_and_which_notebooks_use_it(module):
    docstring = ast.get_docstring(_modules()[module])
    assert docstring, f"{module} has no docstring"
    opening = docstring.split("\n\n")[0]
    assert "notebook" in opening.lower(), f"{module}'s docstring opens without naming the notebooks that use it"


NOTEBOOKS = sorted((PACKAGE.parents[1] / "notebooks").glob("[0-9]*.ipynb"))
LESSONS = "course_utils.lessons"


def _lessons_imported(notebook: Path) -> set[str]:
    """The lessons modules a notebook's code cells import (its magics and shell lines left out)."""
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join(line for cell in cells if cell["cell_type"] == "code"
                     for line in "".join(cell["source"]).splitlines() if not line.lstrip().startswith(("%", "!")))
    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module == LESSONS:
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(LESSONS + "."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[2] for alias in node.names if alias.name.startswith(LESSONS + "."))
    return found


def _named_notebooks(first_line: str) -> set[str]:
    """The notebooks a first line names before its colon: "Notebook 01: ...", "Notebooks 06, 07 and 10: ...",
    or none in "No notebook: ..."."""
    names, colon, _ = first_line.partition(":")
    assert colon and re.fullmatch(r"(No notebook|Notebooks? \d\d((, \d\d)* and \d\d)?)", names), (
        f"the first line {first_line!r} does not open with 'Notebook NN:', 'Notebooks NN, NN and NN:' or "
        "'No notebook:'")
    return set(re.findall(r"\d\d", names))


def test_the_notebook_parser_reads_every_form_of_import(tmp_path):
    notebook = tmp_path / "01_x.ipynb"
    notebook.write_text(json.dumps({"cells": [
        {"cell_type": "code", "source": ["%matplotlib inline\n", "from course_utils.lessons import baseline, noise\n"]},
        {"cell_type": "markdown", "source": ["from course_utils.lessons import reference"]},
        {"cell_type": "code", "source": ["from course_utils.lessons.monitoring import sweep\n",
                                         "import course_utils.lessons.precision as p"]}]}))
    assert _lessons_imported(notebook) == {"baseline", "noise", "monitoring", "precision"}
    assert _named_notebooks("Notebooks 06, 07 and 10: the runs") == {"06", "07", "10"}
    assert _named_notebooks("No notebook: shared") == set()
    with pytest.raises(AssertionError, match="does not open with"):
        _named_notebooks("The figures of notebooks 00-09.")


LESSON_MODULES = sorted(name for name in _modules() if name.startswith(LESSONS + "."))


@pytest.mark.parametrize("module", LESSON_MODULES)
def test_each_lessons_module_names_exactly_the_notebooks_that_import_it(module):
    short = module.rsplit(".", 1)[1]
    importing = {notebook.name[:2] for notebook in NOTEBOOKS if short in _lessons_imported(notebook)}
    first_line = ast.get_docstring(_modules()[module]).splitlines()[0]
    assert _named_notebooks(first_line) == importing, (
        f"{module}'s first line names notebooks {sorted(_named_notebooks(first_line))}, but "
        f"{sorted(importing) or 'no notebook'} import it: {first_line!r}")


def test_a_notebook_shows_the_code_that_ran_not_a_copy(tmp_path):
    from course_utils.notebook import show_code
    from course_utils.training.step import train_step

    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun python -m course_utils.train\n")
    text = show_code(train_step, files=(script,)).data
    assert "**course_utils.training.step.train_step**" in text
    assert "setup.scaler.scale(loss).backward()" in text and text.count("```python") == 1
    assert f"**{script}**\n\n```bash\n#!/bin/bash\n#SBATCH --nodes=2" in text


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_each_notebook_ends_with_a_self_check_of_three_answered_questions(notebook):
    last = "".join(json.loads(notebook.read_text())["cells"][-1]["source"])
    questions, _, answers = last.partition("<details><summary>Answers</summary>")
    assert questions.startswith("## Self-check"), f"{notebook.name} does not end with its self-check"
    for part in (questions, answers):
        assert re.findall(r"^(\d)\. ", part, re.MULTILINE) == ["1", "2", "3"]
