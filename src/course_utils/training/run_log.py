"""What a run records as it trains, for notebooks 01-09 to read back: a record at every log point and at every
epoch's end, in ``metrics.jsonl``, TensorBoard, the progress bar and a line for the person watching.

The loop in :mod:`.loop` hands it each step's loss and images; it times the steps (:class:`StepClock`), keeps
the timings the summary is made from (:class:`StepTimes`) and writes through :class:`MetricsWriter`.
Rank 0 alone writes; every rank takes part in the means over the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from course_utils.observe.clocks import StepClock
from course_utils.observe.memory import StepMemory
from course_utils.observe.metrics import MetricsWriter
from course_utils.parallel.collectives import gather, mean_over_ranks
from course_utils.run_folder import RunFolder
from course_utils.training.evaluate import score_line
from course_utils.training.observers import Observers
from course_utils.training.resume import Position, check_finite
from course_utils.training.schedule import Plan
from course_utils.training.setup import Setup
from course_utils.training.summary import StepTimes, run_summary


@dataclass
class Interval:
    """The steps since the last log point: their summed loss (on the device), images and data waits."""

    loss: torch.Tensor
    images: list[int] = field(default_factory=list)
    data_seconds: list[float] = field(default_factory=list)

    def add(self, loss: torch.Tensor, images: int) -> None:
        self.loss += loss
        self.images.append(images)


@dataclass(frozen=True)
class EpochResult:
    steps: int  # steps of this epoch, those before a resume included
    trained: int  # steps of this epoch that this process trained (after a resume, fewer than ``steps``)
    seconds: float  # training time of this process's part of the epoch, evaluation excluded
    train_loss: float  # mean step loss over the epoch and the ranks
    finished: bool  # False when the run's last step fell mid-epoch


class SummaryNotWritten(OSError):
    """A run trained to its end, but the file system refused its ``summary.json``; the message says what of the run
    is kept and which command gives the summary."""


class RunLog:
    """The records of one run; a context manager that closes its files. ``resume_step``: the step a resumed
    run continues from (its records up to there are kept), None for a new run (the folder's are replaced)."""

    def __init__(self, setup: Setup, plan: Plan, observers: Observers, resume_step: int | None) -> None:
        self.setup, self.plan, self.observers = setup, plan, observers
        self.writer = MetricsWriter(Path(setup.cfg.out), enabled=setup.where.is_main, resume_step=resume_step)
        self.epochs = [record for record in self.writer.kept if record.get("kind") == "epoch"]
        self.times = StepTimes()
        self.clock = StepClock(setup.device)
        self.interval = self._new_interval()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.close()

    def _new_interval(self) -> Interval:
        return Interval(torch.zeros((), device=self.setup.device))

    def start_epoch(self) -> None:
        """Start timing at the epoch's first step (after evaluation, or the replay of a resume)."""
        self.interval = self._new_interval()
        self.clock.start()

    def waited(self, seconds: float) -> None:
        """The seconds the coming step waited for its data."""
        self.interval.data_seconds.append(seconds)

    def stepped(self, loss: torch.Tensor, micro_batches: list) -> None:
        """One optimizer step is done: its time, loss and images count towards the next log point."""
        self.clock.lap()
        self.observers.stepped()
        self.interval.add(loss, sum(len(labels) for _, labels in micro_batches))

    def log_point(self, position: Position, lr: float) -> None:
        """The steps since the last log point, as one record: their mean loss over the ranks, each step's time."""
        interval, step = self.interval, position.step
        seconds = self.clock.drain()
        loss = mean_over_ranks(interval.loss / len(interval.images)).item()
        check_finite(loss, self.setup, position)
        rate = sum(interval.images) / sum(seconds)
        self.writer.record(
            {"kind": "step", "step": step, "epoch": position.epoch + 1, "loss": loss, "lr": lr,
             "images_per_second": rate, "iteration_seconds": seconds, "data_seconds": interval.data_seconds},
            {"train/loss": loss, "train/images_per_second": rate, "train/lr": lr}, step)
        self.times.add(seconds, interval.images, interval.data_seconds)
        self.observers.logged(loss, rate)
        self.interval = self._new_interval()

    def epoch(self, epoch: int, step: int, result: EpochResult, scores: dict[str, float]) -> None:
        """The epoch's record in the metrics, TensorBoard and one line for the person watching."""
        setup, world = self.setup, self.setup.layout.data_ranks
        ranks = gather({"rank": setup.where.rank, "steps": result.steps, "seconds": result.seconds})
        # An epoch the run left mid-way is reported as it stands; a run that continues it reports it again.
        record = {"kind": "epoch", "epoch": epoch + 1, "step": step, "steps": result.steps,
                  "seconds": result.seconds, "train_loss": result.train_loss,
                  "images_per_second": result.trained * setup.images_per_step * world / result.seconds,
                  "ranks": ranks, **scores, **({} if result.finished else {"partial": True})}
        self.epochs.append(record)
        self.writer.record(record, {"epoch/seconds": result.seconds, "train/epoch_loss": result.train_loss,
                                    **{f"test/{name.removeprefix('test_')}": value for name, value in scores.items()
                                       if isinstance(value, float) and name != "eval_seconds"}}, epoch + 1)
        self.observers.say(f"epoch {epoch + 1}/{self.plan.epochs}: {result.seconds:.1f} s, train loss "
                           f"{result.train_loss:.3f}, {score_line(scores)}, "
                           f"{record['images_per_second']:.0f} images/s")

    def summary(self, steps: int, resumed_from: str | None, memory: StepMemory | None) -> dict[str, Any]:
        """The whole run's summary, the same on every rank (all take part in it); rank 0 writes ``summary.json``."""
        summary = run_summary(self.setup, self.plan, self.times, steps, self.epochs, self.observers.monitor,
                              resumed_from, memory)
        try:
            self.writer.summary(summary)
        except OSError as error:
            raise SummaryNotWritten(self._unwritten(steps, error)) from error
        return summary

    def _unwritten(self, steps: int, error: OSError) -> str:
        """What a run that trained to its end and could not write its summary keeps, and what gives the summary."""
        folder = RunFolder(self.setup.cfg.out)
        if self.epochs and self.epochs[-1].get("partial"):
            again = ("its last epoch ended mid-way (--max-steps), which only the process that trained it can "
                     "summarize: make room there and train it again with --overwrite")
        else:
            again = ("make room there, then the same command with --resume auto writes the summary from the metrics "
                     "without training again (with no throughput: only this process timed the steps; --overwrite "
                     "trains it again to measure it)")
        return (f"the training finished ({steps} steps): its checkpoints in {folder.checkpoints} and its metrics are "
                f"whole, but {folder.summary} could not be written ({error.strerror or error}); {again}")
