"""Notebook 12: which rank is the straggler, read from every rank's own step times, and what it cost the others.

The ranks of :mod:`course_utils.doctor.timed_ranks` record each step's seconds waiting for data, computing,
and in the gradients' all-reduce. A rank's *own work* is its data and compute time; the all-reduce ends for all
ranks together, when the last one arrives, so a rank that arrives early waits there. The straggler is the rank
whose own work is longest, named only when it is longer than the next rank's by more than their spreads allow
(:mod:`course_utils.observe.noise`): ranks alike within the noise have no straggler. What it cost each other rank
is that rank's time in the all-reduce beyond the straggler's own (the straggler waits for nobody: its time there
is the transfer alone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from course_utils.doctor.timed_ranks import RECORD
from course_utils.observe.noise import SLOWER, Comparison, Measurement, compare, spread_text

WARMUP_STEPS = 2  # the first steps build buffers and warm caches on every rank alike


def read_ranks(out: Path) -> pd.DataFrame:
    """Every rank's steps, one row per rank and step: its seconds for data, compute and the all-reduce, and the
    ``phase``: "alike", or "one slowed" from the step a rank's loader was slowed on."""
    paths = sorted(Path(out).glob(RECORD.format(rank="*")))
    if not paths:
        raise FileNotFoundError(f"no rank records in {out}: run the cell that launches the timed ranks first")
    rows, starts = [], []
    for path in paths:
        record = json.loads(path.read_text())
        slowed_from = record["slow_from"] if record["slowed"] else None
        rows += [{"rank": record["rank"], **step} for step in record["steps"]]
        if slowed_from is not None:
            starts.append(slowed_from)
    table = pd.DataFrame(rows)
    table["own_seconds"] = table["data_seconds"] + table["compute_seconds"]
    table["phase"] = "alike"
    if starts:
        table.loc[table["step"] >= min(starts), "phase"] = "one slowed"
    return table


@dataclass(frozen=True)
class StragglerVerdict:
    """The straggler (None when the ranks cannot be told apart), on what evidence, and what it cost."""

    rank: int | None
    comparison: Comparison | None  # the slowest rank's own work against the next rank's (as rates)
    own_work: dict[int, Measurement]  # seconds of own work per step, per rank
    waited: dict[int, float] = field(default_factory=dict)  # per other rank: seconds spent waiting for it, in all
    steps: int = 0

    def sentence(self) -> str:
        """Markdown: the verdict and the figures it rests on."""
        ordered = sorted(self.own_work, key=lambda rank: -self.own_work[rank].median)
        works = "; ".join(f"rank {rank} **{self.own_work[rank].median * 1000:.1f} ms** "
                          f"({spread_text(self.own_work[rank])})" for rank in ordered)
        lines = [f"- Own work per step (data and compute, the median of {self.steps} steps): {works}."]
        if self.comparison is None:
            lines.append("- One rank alone: nobody to wait for.")
        elif self.rank is None:
            lines.append(f"- The slowest rank's rate against the next one's: {self.comparison.sentence()} "
                         "**No straggler** is named: the ranks are alike within the noise.")
        else:
            cost = "; ".join(f"rank {rank} waited **{seconds:.2f} s**" for rank, seconds in sorted(self.waited.items()))
            lines.append(f"- **Rank {self.rank} is the straggler**: its rate against the next rank's is "
                         f"{self.comparison.sentence()}")
            lines.append(f"- What it cost the others, at the all-reduce over {self.steps} steps: {cost} "
                         f"(**{sum(self.waited.values()):.2f} rank-seconds** in all, idle while it worked).")
        return "\n".join(lines)


def name_straggler(table: pd.DataFrame, warmup: int = WARMUP_STEPS) -> StragglerVerdict:
    """The straggler among the ranks of ``table`` (:func:`read_ranks`, or one phase of it), judged after the
    launch's first ``warmup`` steps."""
    steady = table[table["step"] >= warmup]
    own = {int(rank): Measurement.of(group["own_seconds"]) for rank, group in steady.groupby("rank")}
    steps = int(steady["step"].nunique())
    if len(own) < 2:
        return StragglerVerdict(None, None, own, steps=steps)
    slowest, runner_up = sorted(own, key=lambda rank: -own[rank].median)[:2]
    comparison = compare(own[slowest].inverse(), own[runner_up].inverse())
    if comparison.verdict != SLOWER:
        return StragglerVerdict(None, comparison, own, steps=steps)
    by_step = steady.pivot(index="step", columns="rank", values="collective_seconds")
    waited = {int(rank): float((by_step[rank] - by_step[slowest]).clip(lower=0).sum())
              for rank in by_step.columns if rank != slowest}
    return StragglerVerdict(slowest, comparison, own, waited, steps)
