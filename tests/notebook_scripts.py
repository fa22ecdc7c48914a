"""The scripts the notebooks' ``%%writefile {scripts}/NAME`` cells write, for the tests that launch them as the
notebooks do (notebooks 11 and 12)."""

import json
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def written_script(notebook: str, name: str) -> str:
    """The script the ``%%writefile {scripts}/NAME`` cell of ``notebooks/NOTEBOOK`` writes."""
    for cell in json.loads((NOTEBOOKS / notebook).read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith(f"%%writefile {{scripts}}/{name}\n"):
            return source.split("\n", 1)[1]
    raise AssertionError(f"no cell of {notebook} writes {name}")
