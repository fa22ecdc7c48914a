"""What a run folder holds, by name: the one place that knows its file names (notebooks 01-08).

The training command writes these files under ``--out``; notebooks, job scripts, the scaling
study and the tests read them back through :class:`RunFolder` instead of spelling the names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
TENSORBOARD = "tensorboard"
MONITOR = "monitor.csv"
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "last.pt"
PREEMPTED = "PREEMPTED"
CRASH_DRILL_DONE = "CRASH_DRILL_DONE"
HOLD = ".hold"


@dataclass(frozen=True)
class RunFolder:
    """The files of one run, under ``path`` (the run's ``--out``)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))  # notebooks pass strings too

    @property
    def metrics(self) -> Path:
        """One JSON object per logged step and per epoch."""
        return self.path / METRICS

    @property
    def summary(self) -> Path:
        """The run's results: throughput, timings, scores and the full configuration."""
        return self.path / SUMMARY

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def monitor(self) -> Path:
        """The device samples of a run with ``--monitor``: those of the node rank 0 ran on."""
        return self.path / MONITOR

    def node_monitor(self, node_rank: int) -> Path:
        """The device samples of one node of a multi-node run (each node's first process samples its node and
        writes here, on that node's disk): node 0's are :attr:`monitor`."""
        return self.monitor if node_rank == 0 else self.monitor.with_name(f"{self.monitor.stem}-node{node_rank}.csv")

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints / LAST_CHECKPOINT

    @property
    def preempted(self) -> Path:
        """The marker a run leaves when a stop signal ended it after its checkpoint."""
        return self.path / PREEMPTED

    @property
    def crash_drill_done(self) -> Path:
        """The marker the crash drill (``--crash-at-step``) leaves before its rank dies: later attempts train on."""
        return self.path / CRASH_DRILL_DONE

    @property
    def hold(self) -> Path:
        """The file a running run keeps locked, so that a second run in the same folder refuses to start."""
        return self.path / HOLD

    @property
    def own_paths(self) -> list[Path]:
        """What the course writes under the names it gives, in the folder and its checkpoints folder."""
        return [self.hold, self.metrics, self.summary, self.tensorboard, self.monitor, self.preempted,
                self.crash_drill_done,                 self.checkpoints, self.last_checkpoint]

    def read_summary(self) -> dict[str, Any]:
        """The finished run's ``summary.json``; a clear error when the run did not finish."""
        if not self.summary.is_file():
            raise FileNotFoundError(f"{self.summary} does not exist: the run did not finish, or --out pointed "
                                    "elsewhere")
        return json.loads(self.summary.read_text())
