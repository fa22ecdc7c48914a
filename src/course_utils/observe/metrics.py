"""What a run writes as it goes and how notebooks read it back (notebooks 01-08).

A run folder holds ``metrics.jsonl`` (one JSON object per logged step and per epoch, each
with a ``kind``), ``summary.json`` and TensorBoard event files under ``tensorboard/``
(:mod:`course_utils.run_folder` names them).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from course_utils.atomic_files import write_text_atomic
from course_utils.observe.noise import Measurement
from course_utils.observe.tensorboard import EVENTS_PREFIX, EventFile
from course_utils.run_folder import RunFolder
from course_utils.shared_folders import naming_the_file, open_file, refuse_link

# pandas only where a table is made: the training command's ranks import this module, and pandas would cost
# each of them 0.7 s of CPU at start-up for tables a run never makes.
if TYPE_CHECKING:
    import pandas as pd


def json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity; write None instead so every reader can parse the file. NumPy's scalars (a
    ``numpy.bool`` from comparing two measurements, say), which ``json`` refuses, are written as Python's."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; a last line cut short (the process died, or the disk filled,
    while writing it) is left out, any other unreadable line is an error that names it."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise ValueError(f"{path}, line {number}, is not a metrics record ({error}); the file was changed "
                             "by hand or damaged") from error
    return records


class MetricsWriter:
    """Appends records to ``metrics.jsonl`` and mirrors scalars to TensorBoard."""

    def __init__(self, out_dir: Path, enabled: bool = True, resume_step: int | None = None) -> None:
        """A new run replaces what the folder held; a resumed one (``resume_step``) keeps the records
        up to that step, drops the later ones (written after the checkpoint, they will be redone) and
        the ``partial`` ones (an epoch reported mid-way, which the resumed run reports whole), and appends."""
        self.folder = RunFolder(out_dir)
        self.enabled = enabled
        self.kept: list[dict[str, Any]] = []
        self._stream = None
        self._events = None
        if enabled:
            self.folder.path.mkdir(parents=True, exist_ok=True)
            path = self.folder.metrics
            if resume_step is None:
                for old in refuse_link(self.folder.tensorboard).glob(f"{EVENTS_PREFIX}*"):
                    old.unlink()
            elif path.exists():
                records = read_records(path)
                self.kept = [r for r in records if r.get("step", 0) <= resume_step and not r.get("partial")]
                write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in self.kept))
            self._stream = open_file(path, "a" if resume_step is not None else "w")
            # purge_step: TensorBoard hides the events of the abandoned steps after the checkpoint.
            self._events = EventFile(self.folder.tensorboard,
                                          purge_step=None if resume_step is None else resume_step + 1)

    def record(self, record: dict[str, Any], scalars: dict[str, float] | None = None, step: int = 0) -> None:
        if not self.enabled:
            return
        with naming_the_file(self.folder.metrics):
            self._stream.write(json.dumps(json_safe(record)) + "\n")
            self._stream.flush()
        self._events.scalars({tag: value for tag, value in (scalars or {}).items()
                                   if value is not None and math.isfinite(value)}, step)

    def summary(self, summary: dict[str, Any]) -> None:
        if self.enabled:
            # Whole or absent: a summary is what marks a run as finished.
            write_text_atomic(self.folder.summary, json.dumps(json_safe(summary), indent=2) + "\n")

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.enabled:
            try:
                with naming_the_file(self.folder.metrics):  # a failed write's line is tried again here
                    self._stream.close()
            finally:
                self._events.close()


@dataclass
class Run:
    """A finished run read back: per-iteration, per-log-point and per-epoch tables, and the summary."""

    out_dir: Path
    iterations: pd.DataFrame  # one row per training iteration: step, epoch, seconds, data_seconds
    steps: pd.DataFrame  # one row per log point: step, epoch, loss, lr, ...
    epochs: pd.DataFrame  # one row per epoch
    summary: dict[str, Any]

    def steady_rate(self) -> Measurement:
        """Images per second of each iteration after the warm-up (rank 0's clock, all ranks' images), as one
        measurement with its spread: what the answers compare runs with."""
        seconds = self.iterations["seconds"].tolist()[self.summary["warmup_steps"]:] if len(self.iterations) else []
        return Measurement.of(seconds).inverse().scaled(self.summary["global_batch_size"])


def load_run(out_dir: Path) -> Run:
    """Read ``metrics.jsonl`` and ``summary.json`` of a run directory."""
    import pandas as pd

    folder = RunFolder(out_dir)
    path = folder.metrics
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {out_dir} the --out of a finished run?")
    records = read_records(path)
    steps = [r for r in records if r["kind"] == "step"]
    iterations = [
        {"step": r["step"] - len(r["iteration_seconds"]) + 1 + i, "epoch": r["epoch"],
         "seconds": s, "data_seconds": d}
        for r in steps
        for i, (s, d) in enumerate(zip(r["iteration_seconds"], r["data_seconds"]))
    ]
    return Run(
        out_dir=folder.path,
        iterations=pd.DataFrame(iterations),
        steps=pd.DataFrame(steps).drop(columns=["iteration_seconds", "data_seconds"], errors="ignore"),
        epochs=pd.DataFrame([r for r in records if r["kind"] == "epoch"]),
        summary=folder.read_summary() if folder.summary.exists() else {},
    )
