"""The loop over epochs of one run, told as a short story (notebooks 01-09, through
:func:`course_utils.train.train` and ``python -m course_utils.train``): each step fetches its batches, steps,
moves the learning rate, logs, checkpoints and stops when asked; each epoch ends with a checkpoint, an
evaluation and a report.

Every rank runs it; rank 0 alone writes metrics, TensorBoard events, checkpoints and the summary.
What it needs lives beside it: the run folder's life cycle (hold, resume, replace, signals, preemption) in
:mod:`.run_life`, the records in :mod:`.run_log`, the plan and learning rate in :mod:`.schedule`, the state a
checkpoint holds in :mod:`.resume`, the observers in :mod:`.observers`, the summary in :mod:`.summary`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from course_utils import devices
from course_utils.observe.memory import StepMemory, measure_step
from course_utils.parallel.collectives import mean_over_ranks
from course_utils.training import fault_drill
from course_utils.training.evaluate import evaluate_run
from course_utils.training.observers import Observers
from course_utils.training.resume import RunState
from course_utils.training.run_life import RunLife
from course_utils.training.run_log import EpochResult, RunLog
from course_utils.training.schedule import Plan, scheduler
from course_utils.training.setup import Setup
from course_utils.training.step import next_step_batches, train_step


class Loop:
    """One run from its first (or resumed) step to its summary; a context manager that closes what it opens."""

    def __init__(self, setup: Setup) -> None:
        self.setup, self.cfg = setup, setup.cfg
        self.plan = Plan.of(setup)
        fault_drill.refuse_unreachable(self.cfg.crash_at_step, self.plan, self.cfg.max_steps)
        self.scheduler = scheduler(setup, self.plan)
        self.state = RunState(setup, self.scheduler)
        self.life = RunLife(setup, self.plan, self.state)
        self.step_memory: StepMemory | None = None  # of the first step this process trains
        self._exits = contextlib.ExitStack()

    def __enter__(self) -> Loop:
        with contextlib.ExitStack() as exits:  # what was entered is closed again if a later step fails
            exits.enter_context(self.life.held())  # hold the folder: no second run writes in it meanwhile
            self.position = self.life.resume()  # from the checkpoint --resume names, or from the beginning
            self.observers = exits.enter_context(Observers(self.setup, self.plan, self.position.step))
            self.life.prepare(self.position, self.observers.say)  # clear what an earlier run left, say what resumed
            exits.enter_context(self.life.signals)  # from here a stop signal ends the run after a step
            resumed_at = self.position.step if self.state.resumed_from else None  # keep the records up to there
            self.log = exits.enter_context(RunLog(self.setup, self.plan, self.observers, resumed_at))
            self._exits = exits.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._exits.close()

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
            self.log.epoch(epoch, self.position.step, result, self.evaluate(epoch))
            if self.position.step < self.plan.total_steps and self.life.stop_requested(at_log_point=True):
                self.life.preempt(self.position.step)
        return self.log.summary(self.position.step, self.state.resumed_from, self.step_memory)

    def train_epoch(self) -> EpochResult:
        """Train the rest of the current epoch, logging at log points and checkpointing when asked."""
        setup, position = self.setup, self.position
        setup.model.train()
        setup.loaders.set_epoch(position.epoch)  # each epoch its own sample order, the same on every rank
        self.observers.phase(f"epoch {position.epoch + 1}")
        batches = self.state.epoch_batches(position)  # after a resume, from where the checkpoint stopped
        first_step, start, exhausted = position.epoch_step, time.perf_counter(), False
        self.log.start_epoch()
        while not self._epoch_done():
            micro_batches = self._fetch(batches)  # fetch: the step's batches, on the device
            if micro_batches is None:
                exhausted = True  # the loader ran out before the plan's steps
                break
            loss = self._step(micro_batches)  # step: forward, backward, the optimizer's update
            self.scheduler.step()  # schedule: the learning rate of the next step
            self.log.stepped(loss, micro_batches)  # its time (on a GPU a CUDA event: no wait), loss and images
            position.advance(loss)
            log_point = position.step % self.cfg.log_every == 0 or self._epoch_done()
            if log_point:  # log: reading the loss waits for the device, so only every --log-every steps
                self.log.log_point(position, self.scheduler.get_last_lr()[0])
            # notebook 12's crash, on the job's first attempt only
            fault_drill.crash_if_due(self.cfg.crash_at_step, position.step, setup.where, self.life.folder)
            if self._epoch_done():
                break  # the epoch's end checkpoints in run(), before its evaluation
            stop = self.life.stop_requested(log_point)  # SIGTERM, SIGUSR1 or Ctrl-C; under DDP, on any rank
            if stop or (self.cfg.checkpoint_every and position.step % self.cfg.checkpoint_every == 0):
                self.state.save(position, self.cfg.keep_checkpoints)  # checkpoint: when due, and before a stop
            if stop:
                self.life.preempt(position.step)  # stop: leave a marker for the job to requeue on, and exit
        devices.synchronize(setup.device)  # the clock below must not stop before the device's queued work
        seconds = time.perf_counter() - start
        train_loss = mean_over_ranks(position.epoch_loss_sum / position.epoch_step).item()
        finished = exhausted or position.epoch_step == self.plan.steps_per_epoch
        return EpochResult(position.epoch_step, position.epoch_step - first_step, seconds, train_loss, finished)

    def _epoch_done(self) -> bool:
        return (self.position.step >= self.plan.total_steps
                or self.position.epoch_step >= self.plan.steps_per_epoch)

    def _fetch(self, batches: Iterator) -> list | None:
        """The next step's micro-batches on the device (None: the epoch has fewer left), timing the wait."""
        start = time.perf_counter()
        micro_batches = next_step_batches(batches, self.setup, self.observers.ranges)
        if micro_batches is not None:
            self.log.waited(time.perf_counter() - start)
        return micro_batches

    def _step(self, micro_batches: list) -> torch.Tensor:
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
        """Test loss and accuracy (a detector's box AP) on the whole test set, and how long that took."""
        self.observers.phase(f"eval {epoch + 1}")
        start = time.perf_counter()
        return {**evaluate_run(self.setup), "eval_seconds": time.perf_counter() - start}
