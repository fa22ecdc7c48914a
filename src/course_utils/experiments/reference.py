"""Notebooks 01, 02, 04, 05, 06, 07, 08, 09 and 10: numbers measured on real machines, recorded under
``benchmarks/results/`` by the benchmarks, for comparison.

Each result file is JSON with at least ``benchmark``, ``device``, ``date``, ``versions``, ``data`` (what
the runs trained on: the official set, a generated stand-in of it, or synthetic tensors) and ``rows`` (a
list of flat records). A learner on a laptop sees what a GPU did with the same code.
"""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from course_utils import config
from course_utils.atomic_files import write_text_atomic
from course_utils.config import checkout_root
from course_utils.data import cifar, coco
from course_utils.observe.metrics import json_safe

RESULTS_VARIABLE = "COURSE_RESULTS_DIR"  # where benchmarks write instead (a run that sorts its results first)


def results_dir() -> Path:
    """``benchmarks/results/`` of the checkout, or ``$COURSE_RESULTS_DIR`` where a caller stages its results."""
    return Path(os.environ.get(RESULTS_VARIABLE) or checkout_root() / "benchmarks" / "results")


def table(benchmark: str) -> pd.DataFrame:
    """All recorded rows of ``benchmark``, one per row, with device, host CPU, date, torch and data columns."""
    rows = []
    for path in sorted(results_dir().glob("*.json")):
        result = json.loads(path.read_text())
        if result.get("benchmark") != benchmark:
            continue
        for row in result["rows"]:
            rows.append({"device": result["device"], "cpu": result.get("machine", {}).get("cpu", ""),
                         "date": result["date"], "torch": result["versions"].get("torch", ""),
                         "data": result.get("data", "not recorded"), **row})
    return pd.DataFrame(rows)


def gpu_rows(benchmark: str) -> pd.DataFrame:
    """The recorded rows of ``benchmark`` measured on a GPU (their device is not the CPU): what a lesson may
    cite as GPU results, and only these."""
    rows = table(benchmark)
    return rows[rows["device"] != "CPU"] if not rows.empty else rows


def gpu_note(benchmark: str) -> str:
    """Markdown: how many GPU rows of ``benchmark`` are recorded, or that none are and how to record them."""
    rows = gpu_rows(benchmark)
    if rows.empty:
        return (f"No GPU result of `{benchmark}` is recorded in `benchmarks/results/` yet: on a GPU, "
                f"`python benchmarks/{benchmark}.py` records one there (with its device, versions and date).")
    devices = ", ".join(sorted(rows["device"].unique()))
    lines = [f"Recorded on GPUs in `benchmarks/results/`: {len(rows)} rows of `{benchmark}` ({devices}). What they "
             "trained on (the table's `data` column, whole):"]
    for data, same in rows.groupby("data", sort=False):
        lines.append(f"- {', '.join(sorted(same['device'].unique()))}: {data}.{_data_meaning(data)}")
    return "\n".join(lines)


def _data_meaning(data: str) -> str:
    """What a recorded row's data says about its figures: a stand-in's speed is the model's, its accuracy not."""
    if data.startswith("generated stand-in"):
        return (" Generated images, not CIFAR-100 photos: the speed is the real model's on images of the real size "
                "and format, but the accuracy says nothing about CIFAR-100.")
    if data == SYNTHETIC:
        return " Random tensors already on the device: the model's speed alone, no data loading, no accuracy."
    return ""


def recorded_on_gpus(benchmark: str, command: str) -> pd.DataFrame | str:
    """The rows of ``benchmark`` recorded on a GPU, or, where there are none, one sentence that says so and
    names ``command``, which records them."""
    rows = gpu_rows(benchmark)
    if len(rows):
        return rows
    return (f"No GPU numbers of {benchmark} are recorded in benchmarks/results/ yet: on a machine with 2 or more "
            f"GPUs, `{command}` records them there, and this cell shows them.")


def cpu_model() -> str:
    """The CPU's model name, as the results record it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


SYNTHETIC = "synthetic tensors (no data set read)"


def data_used(dataset: str = "cifar100") -> str:
    """What the active size's ``dataset`` is (official, or a generated stand-in), without its folder: a
    result measured on stand-in images says so. ``synthetic``: no data set at all."""
    if dataset == "synthetic":
        return SYNTHETIC
    root = config.data_dir(dataset=dataset)
    return coco.kind(root) if dataset == "coco" else cifar.kind(root)


@dataclass(frozen=True)
class Goal:
    """One recorded figure against the goal set for it, and where that goal comes from."""

    figure: str  # what was measured: "bf16 matmul, share of the dense peak"
    value: float | None  # None: not measured (the stage could not run, the run was cut short)
    goal: str  # the goal in words: "at least 0.60"
    met: bool | None  # None: nothing to judge
    source: str  # the published figure or the reasoning the goal rests on

    def line(self) -> str:
        """The goal as the summaries print it: figure, value, goal, verdict."""
        verdict = {True: "met", False: "NOT met", None: "not judged"}[self.met]
        value = "not measured" if self.value is None else f"{self.value:.3g}"
        return f"{self.figure}: {value} (goal {self.goal}): {verdict}"


def record(benchmark: str, rows: list[dict], device: str, data: str, goals: list[Goal] | None = None,
           path: Path | None = None) -> Path:
    """Write ``rows`` measured on ``device`` with ``data`` (:func:`data_used`) as a new result file, with the
    ``goals`` they are read against; return its path. ``path``: rewrite that file instead (a benchmark that
    records each row the moment it exists, so that a run cut short keeps what it finished)."""
    import torch
    import torchvision

    now = datetime.now(timezone.utc)
    if path is None:
        slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
        stem = f"{benchmark}-{slug}-{now:%Y%m%d-%H%M%S}"
        path = results_dir() / f"{stem}.json"
        for number in range(2, 100):  # two results of one benchmark within a second keep both
            if not path.exists():
                break
            path = results_dir() / f"{stem}-{number}.json"
    result = {
        "benchmark": benchmark,
        "device": device,
        "date": now.strftime("%Y-%m-%d"),
        "machine": {"cpu": cpu_model(), "cpu_cores": os.cpu_count(), "usable_cores": config.usable_cores()},
        "data": data,
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                     "python": platform.python_version(), "cuda": torch.version.cuda, "hip": torch.version.hip},
        "rows": rows,
        "goals": [asdict(goal) for goal in goals or []],
    }
    return write_text_atomic(Path(path), json.dumps(json_safe(result), indent=2) + "\n")
