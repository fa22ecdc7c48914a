"""Notebooks 01, 07, 09 and 11: the learner's training scripts as one series.

Each script is the previous one plus its lesson's change, so each notebook shows that change as a diff to read
line by line; the pieces that do not change (the data, the model, joining and leaving the group) come from the
package, written once.
"""

from __future__ import annotations

import difflib
import html
import re
from dataclasses import dataclass
from pathlib import Path

from course_utils import config
from course_utils.config import Size
from course_utils.saved_notebooks import shipped_code_cells

# Each step: the notebook whose %%writefile cell writes the script, and the script's name.
SERIES = (
    ("01_single_gpu_baseline.ipynb", "train_single.py"),
    ("07_ddp.ipynb", "ddp_minimal.py"),
    ("09_sharding_and_memory.ipynb", "fsdp_minimal.py"),
    ("11_tensor_and_pipeline_parallel.ipynb", "tp_minimal.py"),
)


def shipped_script(notebook: str, name: str) -> str:
    """The script the ``%%writefile {folder}/NAME`` cell of ``notebooks/NOTEBOOK`` writes, read from the checkout's
    notebook (:func:`course_utils.saved_notebooks.shipped_code_cells`)."""
    writes = re.compile(rf"%%writefile \{{\w+\}}/{re.escape(name)}\n")
    for source in shipped_code_cells(notebook):
        if writes.match(source):
            return source.split("\n", 1)[1]
    raise LookupError(f"no %%writefile cell of notebooks/{notebook} writes {name}")


def script_flags(size: Size, device: str, **more: object) -> list[str]:
    """The series' command-line arguments at ``size``, on ``device`` (``cpu``, or ``cuda``: one GPU per rank),
    plus ``more`` (``max_steps=2`` gives ``--max-steps 2``; a None value is left out)."""
    values = {"data_dir": config.data_dir(size), "samples": size.train_samples, "model": size.model,
              "batch_size": size.batch_size, "lr": size.lr, "workers": size.workers, "epochs": size.epochs,
              "device": device, **more}
    return [part for name, value in values.items() if value is not None
            for part in (f"--{name.replace('_', '-')}", str(value))]


@dataclass(frozen=True)
class Changes:
    """What a script of the series changes in the one before it, as a unified diff."""

    previous: str
    name: str
    lines: tuple[str, ...]

    @property
    def added(self) -> int:
        return sum(line.startswith("+") and not line.startswith("+++") for line in self.lines)

    @property
    def removed(self) -> int:
        return sum(line.startswith("-") and not line.startswith("---") for line in self.lines)

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def _repr_html_(self) -> str:
        colours = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}
        rows = "".join(f'<div style="background:{colours.get(line[:1], "transparent")}">{html.escape(line) or " "}'
                       "</div>" for line in self.lines)
        return (f"<p><b>{self.name}</b> against <b>{self.previous}</b>: {self.added} lines added, {self.removed} "
                f'taken out</p><pre style="line-height:1.25">{rows}</pre>')


def changes(script: str | Path, context: int = 2) -> Changes:
    """The learner's ``script`` of the series, as it is written now, against the previous script as the course
    ships it: the lesson's change, plus any of the learner's own."""
    script = Path(script)
    names = [name for _, name in SERIES]
    if script.name not in names[1:]:
        raise ValueError(f"{script.name} follows no script of the series ({', '.join(names)})")
    if not script.is_file():
        raise FileNotFoundError(f"{script} is not there yet: run its %%writefile cell first")
    notebook, previous = SERIES[names.index(script.name) - 1]
    before = shipped_script(notebook, previous).splitlines()
    diff = difflib.unified_diff(before, script.read_text().splitlines(), f"{previous} ({notebook[:2]})",
                                script.name, n=context, lineterm="")
    return Changes(previous, script.name, tuple(diff))
