"""The loop over epochs of one run, told as a short story: train the epoch, checkpoint, evaluate, report
(notebooks 01-09, through :func:`course_utils.train.train` and ``python -m course_utils.train``).

Every rank runs it; rank 0 alone writes metrics, TensorBoard events, checkpoints and the summary.
What it needs lives beside it: the plan and learning rate in :mod:`.schedule`, the state a
checkpoint holds in :mod:`.resume`, the observers in :mod:`.observers`, the summary in :mod:`.summary`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from course_utils import devices
from course_utils.data import coco
from course_utils.observe.clocks import StepClock
from course_utils.observe.memory import StepMemory, measure_step
from course_utils.observe.metrics import MetricsWriter, read_records
from course_utils.parallel.collectives import any_rank, from_rank_zero, gather, mean_over_ranks
from course_utils.parallel.sharding import is_sharded
from course_utils.run_folder import RunFolder
from course_utils.training import checkpoint, preemption
from course_utils.training.detection_eval import evaluate_detection
from course_utils.training.evaluate import evaluate, score_line
from course_utils.training.folder_hold import held_by_rank_zero
from course_utils.training.observers import Observers
from course_utils.training.preemption import Preempted, StopSignals
from course_utils.training.resume import Position, RunState, check_finite
from course_utils.training.schedule import Plan, scheduler
from course_utils.training.setup import Setup
from course_utils.training.step import next_step_batches, train_step
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


class Loop:
    """One run from its first (or resumed) step to its summary; a context manager that closes what it opens."""

    def __init__(self, setup: Setup) -> None:
        self.setup, self.cfg = setup, setup.cfg
        self.folder = RunFolder(setup.cfg.out)
        self.plan = Plan.of(setup)
        self.scheduler = scheduler(setup, self.plan)
        self.state = RunState(setup, self.scheduler)
        self.position = Position.start(setup.device)
        self.clock = StepClock(setup.device)
        self.times = StepTimes()
        self.step_memory: StepMemory | None = None  # of the first step this process trains
        self._exits = contextlib.ExitStack()

    def __enter__(self) -> Loop:
        main = self.setup.where.is_main
        with self._exits as exits:  # what was entered is closed again if a later step fails
            # The folder is this run's before any rank reads a checkpoint from it, and its stop marker is cleared
            # at once: a run that fails from here on did not stop for a signal, and its job must not requeue.
            exits.enter_context(held_by_rank_zero(self.folder, main))
            if main:
                preemption.clear(self.folder)
            self._resume()
            resumed = self.state.resumed_from is not None
            self.observers = exits.enter_context(Observers(self.setup, self.plan, self.position.step))
            self._prepare_folder()
            self.signals = exits.enter_context(StopSignals(announce=main))
            self.writer = exits.enter_context(MetricsWriter(
                self.folder.path, enabled=main, resume_step=self.position.step if resumed else None))
            self.epoch_records = [record for record in self.writer.kept if record.get("kind") == "epoch"]
            self._exits = exits.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._exits.close()

    def _resume(self) -> None:
        resumed = self.state.resume(self.cfg.resume) if self.cfg.resume else None
        self.position = resumed or self.position
        if resumed is not None and resumed.epoch_step >= self.plan.steps_per_epoch:
            raise ValueError(
                f"{self.state.resumed_from} stopped {resumed.epoch_step} steps into epoch {resumed.epoch + 1}, but an "
                f"epoch of this run has {self.plan.steps_per_epoch} steps: its training data is smaller than the "
                f"data of the run that wrote it (--data-dir {self.cfg.data_dir}); resume on the same data, or start "
                "a new run with another --out")
        if self.position.step < self.plan.total_steps:
            return
        # At the last step: a run whose summary was lost (a full disk as it was written) gets it now, from the
        # records of its epochs; rank 0 reads them and every rank goes on, or stops, with it.
        refusal = from_rank_zero(self._nothing_to_resume() if self.setup.where.is_main else None)
        if refusal:
            raise ValueError(refusal)

    def _nothing_to_resume(self) -> str | None:
        """Why a run resumed at its last step has nothing to do (None: its summary is to be written)."""
        folder, steps = self.folder, self.position.step
        further = "raise --epochs or --max-steps to train further"
        if folder.summary.is_file():
            return f"{folder.path} holds a finished run ({steps} steps): nothing to resume; {further}, or choose " \
                   "another --out"
        records = read_records(folder.metrics) if folder.metrics.is_file() else []
        if not any(r.get("kind") == "epoch" and r.get("step") == steps and not r.get("partial") for r in records):
            return (f"{folder.path} holds a run at its last step ({steps}), but its last epoch's record and its "
                    f"summary were never written (a full disk?), so there is nothing to summarize; {further}, "
                    "or train it again with --overwrite")
        return None

    def run(self) -> dict[str, Any]:
        """Train to the end of the plan; the summary, which rank 0 also writes to ``summary.json``."""
        if self.position.step >= self.plan.total_steps:
            self.observers.say("nothing left to train: the summary is written from the run's records (this process "
                               "timed no step, so it reports no throughput)")
        while self.position.step < self.plan.total_steps:
            epoch = self.position.epoch
            result = self.train_epoch()
            if result.finished:
                self.position.next_epoch()
            # The epoch's training is kept before its evaluation, which may fail on data (or be stopped).
            self.state.save(self.position, self.cfg.keep_checkpoints)
            self.report(epoch, result, self.evaluate(epoch))
            if self.position.step < self.plan.total_steps and self._stop_requested(at_log_point=True):
                self._preempt()
        summary = run_summary(self.setup, self.plan, self.times, self.position.step, self.epoch_records,
                              self.observers.monitor, self.state.resumed_from, self.step_memory)
        self.writer.summary(summary)
        return summary

    def train_epoch(self) -> EpochResult:
        """Train the rest of the current epoch, logging at log points and checkpointing when asked."""
        setup, position = self.setup, self.position
        setup.model.train()
        setup.loaders.set_epoch(position.epoch)
        self.observers.phase(f"epoch {position.epoch + 1}")
        batches = self.state.epoch_batches(position)
        first_step = position.epoch_step
        interval, exhausted = Interval(torch.zeros((), device=setup.device)), False
        start = time.perf_counter()
        self.clock.start()
        while not self._epoch_done():
            fetch_start = time.perf_counter()
            micro_batches = next_step_batches(batches, setup, self.observers.ranges)
            if micro_batches is None:
                exhausted = True  # the loader ran out before the plan's steps
                break
            interval.data_seconds.append(time.perf_counter() - fetch_start)
            loss = self._train_step(micro_batches)
            self.scheduler.step()
            self.clock.lap()
            self.observers.stepped()
            position.advance(loss)
            interval.add(loss, sum(len(labels) for _, labels in micro_batches))
            interval = self._after_step(interval)
        devices.synchronize(setup.device)
        seconds = time.perf_counter() - start
        train_loss = mean_over_ranks(position.epoch_loss_sum / position.epoch_step).item()
        finished = exhausted or position.epoch_step == self.plan.steps_per_epoch
        return EpochResult(position.epoch_step, position.epoch_step - first_step, seconds, train_loss, finished)

    def _train_step(self, micro_batches: list) -> torch.Tensor:
        """One step; the first one this process trains also measures its memory, by kind."""
        setup = self.setup
        if self.step_memory is not None:
            return train_step(setup, micro_batches, self.observers.ranges)
        # A compiled model saves its activations inside its graph, where the hooks cannot count them.
        with measure_step(setup.model, setup.optimizer, setup.device, setup.recomputed,
                          activations=not self.cfg.compile) as measured:
            loss = train_step(setup, micro_batches, self.observers.ranges)
        self.step_memory = measured[0]
        return loss

    def evaluate(self, epoch: int) -> dict[str, float]:
        """Test loss and accuracy on the whole test set, and how long that took."""
        setup = self.setup
        self.observers.phase(f"eval {epoch + 1}")
        start = time.perf_counter()
        with setup.autocast():
            if self.cfg.detection:  # box AP by pycocotools' COCOeval over every rank's detections
                data = coco.ground_truth(setup.loaders.test)
                scores = evaluate_detection(setup.model, setup.loaders.test, setup.device, data.coco, data.categories)
            else:
                scores = evaluate(setup.model, setup.loaders.test, setup.device, setup.loaders.test_on_device,
                                  setup.loaders.test_sharded, lockstep=is_sharded(setup.model))
        return {**scores, "eval_seconds": time.perf_counter() - start}

    def report(self, epoch: int, result: EpochResult, scores: dict[str, float]) -> None:
        """The epoch's record in the metrics, TensorBoard and one line for the person watching."""
        setup, world = self.setup, self.setup.layout.data_ranks
        ranks = gather({"rank": setup.where.rank, "steps": result.steps, "seconds": result.seconds})
        # An epoch the run left mid-way is reported as it stands; a run that continues it reports it again.
        record = {"kind": "epoch", "epoch": epoch + 1, "step": self.position.step, "steps": result.steps,
                  "seconds": result.seconds, "train_loss": result.train_loss,
                  "images_per_second": result.trained * setup.images_per_step * world / result.seconds,
                  "ranks": ranks, **scores, **({} if result.finished else {"partial": True})}
        self.epoch_records.append(record)
        self.writer.record(record, {"epoch/seconds": result.seconds, "train/epoch_loss": result.train_loss,
                                    **{f"test/{name.removeprefix('test_')}": value for name, value in scores.items()
                                       if isinstance(value, float) and name != "eval_seconds"}}, epoch + 1)
        self.observers.say(f"epoch {epoch + 1}/{self.plan.epochs}: {result.seconds:.1f} s, train loss "
                           f"{result.train_loss:.3f}, {score_line(scores)}, "
                           f"{record['images_per_second']:.0f} images/s")

    def _epoch_done(self) -> bool:
        return (self.position.step >= self.plan.total_steps
                or self.position.epoch_step >= self.plan.steps_per_epoch)

    def _after_step(self, interval: Interval) -> Interval:
        """Log at log points; checkpoint when ``--checkpoint-every`` or a stop signal asks. Returns the
        interval to add the next step to (a new one after a log point)."""
        position, epoch_done = self.position, self._epoch_done()
        log_point = position.step % self.cfg.log_every == 0 or epoch_done
        if log_point:
            self._log(interval)
            interval = Interval(torch.zeros((), device=self.setup.device))
        if epoch_done:
            return interval  # the epoch's end checkpoints in run()
        if self._stop_requested(log_point):
            self.state.save(position, self.cfg.keep_checkpoints)
            self._preempt()
        if self.cfg.checkpoint_every and position.step % self.cfg.checkpoint_every == 0:
            self.state.save(position, self.cfg.keep_checkpoints)
        return interval

    def _log(self, interval: Interval) -> None:
        seconds = self.clock.drain()
        loss = mean_over_ranks(interval.loss / len(interval.images)).item()
        check_finite(loss, self.setup, self.position)
        rate = sum(interval.images) / sum(seconds)
        lr = self.scheduler.get_last_lr()[0]
        step = self.position.step
        self.writer.record(
            {"kind": "step", "step": step, "epoch": self.position.epoch + 1, "loss": loss, "lr": lr,
             "images_per_second": rate, "iteration_seconds": seconds, "data_seconds": interval.data_seconds},
            {"train/loss": loss, "train/images_per_second": rate, "train/lr": lr}, step)
        self.times.add(seconds, interval.images, interval.data_seconds)
        self.observers.logged(loss, rate)

    def _prepare_folder(self) -> None:
        """Clear what an earlier process left (half-written files, a summary that this run will replace), after
        making sure that checkpoints can be written and that no unfinished run is deleted without ``--overwrite``."""
        if not self.setup.where.is_main:
            return
        folder, position = self.folder, self.position
        checkpoint.check_writable(folder.checkpoints)
        if not self.state.resumed_from:
            self._replace_earlier_run()
        checkpoint.remove_partial(folder.checkpoints)
        folder.summary.unlink(missing_ok=True)  # a folder with checkpoints and no summary holds an unfinished run
        for reason in self.state.skipped:
            self.observers.say(f"skipped a checkpoint: {reason}")
        if self.state.resumed_from:
            self.observers.say(f"resuming from {self.state.resumed_from}: step {position.step}, epoch "
                               f"{position.epoch + 1}, {position.epoch_step} steps into it")
            if self.state.resharded_from:
                self.observers.say(f"resharded: written by {self.state.resharded_from} ranks, continued by "
                                   f"{self.setup.where.world_size} with the same global batch and sample order; "
                                   "random augmentations are drawn anew")
        elif self.cfg.resume:
            self.observers.say(f"no checkpoint in {folder.checkpoints} yet: starting from the beginning")

    def _replace_earlier_run(self) -> None:
        """A new run replaces a finished run's checkpoints, as its metrics; an unfinished run's only when told."""
        folder = self.folder
        earlier = checkpoint.candidates(folder.checkpoints)
        if not earlier:
            return
        if not folder.summary.is_file() and not self.cfg.overwrite:
            raise FileExistsError(
                f"{folder.path} holds a run that did not finish (its newest checkpoint is {earlier[0].name}): "
                "continue it with --resume auto, start this run elsewhere with another --out, or replace it "
                "with --overwrite")
        checkpoint.remove_all(folder.checkpoints)
        self.observers.say(f"a new run in {folder.path}: the earlier run's checkpoints were removed")

    def _stop_requested(self, at_log_point: bool) -> bool:
        """Whether SIGTERM/SIGUSR1 arrived; under DDP the ranks agree at log points, so all stop at one step."""
        received = self.signals.received is not None
        if self.setup.where.world_size == 1:
            return received
        return at_log_point and any_rank(received, self.setup.device)

    def _preempt(self) -> None:
        by = self.signals.received or "a signal on another rank"
        if self.setup.where.is_main:
            preemption.mark(self.folder, self.position.step, by)
        raise Preempted(f"stopped by {by} after step {self.position.step}; the checkpoint is in "
                        f"{self.folder.checkpoints}: continue with --resume auto")
