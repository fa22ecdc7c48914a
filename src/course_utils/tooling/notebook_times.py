"""No notebook: how long each notebook takes, per size and machine, as ``benchmarks/notebook_times.py``
measured it, kept in ``benchmarks/results/notebook_times.csv``; the README's table, the instructor guide's
and every notebook's "Time" line are written from it (:mod:`course_utils.tooling.time_lines`).

One row per notebook, size and machine. Recording a new measurement replaces the row of the same three and
keeps every other, so a GPU machine's rows and a laptop's live side by side. A row measured without a GPU
(``gpus`` 0) is never read as a GPU's.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import platform
import subprocess
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from course_utils import config, devices
from course_utils.atomic_files import write_text_atomic
from course_utils.experiments import reference

TABLE = "notebook_times.csv"
# Other processes using half a core or more on average while a notebook ran make its time a busy machine's.
BUSY_CORES = 0.5


@dataclass(frozen=True)
class NotebookTime:
    notebook: str  # the notebook's file name without .ipynb, e.g. 07_ddp
    size: str  # COURSE_SIZE: ci or workshop
    machine: str  # e.g. "2-core AMD EPYC, no GPU" or "2 x AMD Instinct MI250X (LUMI GCDs), 14-core host"
    gpus: int  # GPUs the notebook could use; 0: a CPU-only machine
    cpu_cores: int
    seconds: float  # wall time from the kernel's start to its end, every cell run
    other_load: float | None  # CPU cores other processes used meanwhile, on average (None: unknown)
    busy: str  # "yes" when other_load >= BUSY_CORES, "no", or "unknown"
    date: str
    commit: str  # the course's commit that was timed ("-dirty": with uncommitted changes)
    torch: str
    torchvision: str
    python: str
    runtime: str  # "CUDA 13.0", "HIP 6.4..." on GPUs; "" without (the torch version names its build)
    code: str  # the digest of the notebook's code cells that ran (:func:`code_digest`)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.notebook, self.size, self.machine

    @property
    def on_gpus(self) -> bool:
        return self.gpus > 0


COLUMNS = tuple(field.name for field in fields(NotebookTime))


def code_digest(notebook: Path) -> str:
    """A short digest of a notebook's code cells, in order: what a timing measured. Prose and outputs are left
    out: a "Time" line rewritten, or a paragraph edited, does not change what the notebook runs."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    code = "\0".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    return hashlib.sha256(code.encode()).hexdigest()[:12]


def stale(row: NotebookTime, code_now: dict[str, str]) -> bool:
    """Whether ``row`` timed other code than its notebook's now (``code_now``: notebook -> :func:`code_digest`)."""
    return row.notebook in code_now and row.code != code_now[row.notebook]


def table_path() -> Path:
    return reference.results_dir() / TABLE


def _parsed(record: dict[str, str], path: Path, line: int) -> NotebookTime:
    try:
        return NotebookTime(**{**record, "gpus": int(record["gpus"]), "cpu_cores": int(record["cpu_cores"]),
                               "seconds": float(record["seconds"]),
                               "other_load": float(record["other_load"]) if record["other_load"] else None})
    except ValueError as error:
        raise ValueError(f"{path}, line {line}: {error}; measure that notebook again with "
                         "`python benchmarks/notebook_times.py NOTEBOOK` or fix the row by hand") from None


def read(path: Path | None = None) -> list[NotebookTime]:
    """Every recorded row; none when the table does not exist yet."""
    path = path or table_path()
    if not path.exists():
        return []
    reader = csv.DictReader(io.StringIO(path.read_text()))
    missing = [column for column in COLUMNS if column not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"{path} lacks the columns {', '.join(missing)}: its header must be {','.join(COLUMNS)}")
    return [_parsed(record, path, line) for line, record in enumerate(reader, start=2)]


def merged(rows: list[NotebookTime], new: list[NotebookTime]) -> list[NotebookTime]:
    """``rows`` with ``new`` in place of the rows of the same notebook, size and machine, in a stable order."""
    replaced = {row.key for row in new}
    kept = [row for row in rows if row.key not in replaced]
    return sorted(kept + new, key=lambda row: (row.notebook, row.size, row.on_gpus, row.machine))


def _text(rows: list[NotebookTime]) -> str:
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**asdict(row), "other_load": "" if row.other_load is None else f"{row.other_load:.2f}",
                         "seconds": f"{row.seconds:.1f}"})
    return stream.getvalue()


def record(new: list[NotebookTime], path: Path | None = None) -> list[NotebookTime]:
    """Add ``new`` to the table (replacing the rows it measures again), written whole; return all rows."""
    path = path or table_path()
    rows = merged(read(path), new)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, _text(rows))
    return rows


def measured(rows: list[NotebookTime], notebook: str, size: str, on_gpus: bool) -> NotebookTime | None:
    """The newest row of ``notebook`` at ``size`` on a GPU machine (``on_gpus``) or a CPU-only one, if any."""
    matching = [row for row in rows if (row.notebook, row.size, row.on_gpus) == (notebook, size, on_gpus)]
    return max(matching, key=lambda row: row.date, default=None)


def busy(other_load: float | None) -> str:
    return "unknown" if other_load is None else "yes" if other_load >= BUSY_CORES else "no"


def this_machine(label: str | None = None) -> tuple[str, int, int]:
    """(description, GPUs, CPU cores) of the machine this process runs on; ``label`` names it instead of
    the description, e.g. "LUMI-G, 2 GCDs (Jupyter app)"."""
    accelerator = devices.detect()
    cores = config.usable_cores()
    if accelerator.gpus:
        described = f"{len(accelerator.gpus)} x {accelerator.gpus[0].name}, {cores}-core host"
    else:
        described = f"{cores}-core {reference.cpu_model()}, no GPU"
    return label or described, len(accelerator.gpus), cores


def versions(gpus: int) -> dict[str, str]:
    """The versions a row records; the GPU runtime only where the notebooks had GPUs to run on."""
    import torch
    import torchvision

    runtime = (f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
               if torch.version.cuda else "") if gpus else ""
    return {"torch": torch.__version__, "torchvision": torchvision.__version__,
            "python": platform.python_version(), "runtime": runtime}


def course_commit() -> str:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it; ``unknown`` outside git."""
    result = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=10"], cwd=config.checkout_root(),
                            capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def today() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")
