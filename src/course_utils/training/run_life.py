"""The run folder's life cycle around the training loop: hold, resume, replace, stop signals, preemption
(notebooks 01-09, every run of the training command).

The loop in :mod:`.loop` calls it at four places: before it reads a checkpoint (:meth:`RunLife.held`,
:meth:`RunLife.resume`), once its observers run (:meth:`RunLife.prepare`), at log points
(:meth:`RunLife.stop_requested`) and when a signal ends the run (:meth:`RunLife.preempt`). What it builds on
lives beside it: the hold in :mod:`.folder_hold`, the signals and the marker in :mod:`.preemption`, the
checkpoint's state in :mod:`.resume`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import NoReturn

from course_utils.observe.metrics import read_records
from course_utils.parallel.collectives import any_rank, from_rank_zero
from course_utils.run_folder import RunFolder
from course_utils.training import checkpoint, fault_drill, preemption
from course_utils.training.folder_hold import held_by_rank_zero
from course_utils.training.preemption import Preempted, StopSignals
from course_utils.training.resume import Position, RunState
from course_utils.training.schedule import Plan
from course_utils.training.setup import Setup


class RunLife:
    """One run's life in its folder: every rank calls each method; rank 0 alone changes the folder."""

    def __init__(self, setup: Setup, plan: Plan, state: RunState) -> None:
        self.setup, self.cfg, self.plan, self.state = setup, setup.cfg, plan, state
        self.folder = RunFolder(setup.cfg.out)
        self.main = setup.where.is_main
        self.signals = StopSignals(announce=self.main)  # entered by the loop once the folder is ready

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The folder is this run's before any rank reads a checkpoint from it, and its stop marker is cleared at
        once: a run that fails from here on did not stop for a signal, and its job must not requeue."""
        with held_by_rank_zero(self.folder, self.main):
            if self.main:
                preemption.clear(self.folder)
            yield

    def resume(self) -> Position:
        """Where the run starts: the position of the checkpoint ``--resume`` names, or the beginning."""
        resumed = self.state.resume(self.cfg.resume) if self.cfg.resume else None
        position = resumed or Position.start(self.setup.device)
        if resumed is not None and resumed.epoch_step >= self.plan.steps_per_epoch:
            raise ValueError(
                f"{self.state.resumed_from} stopped {resumed.epoch_step} steps into epoch {resumed.epoch + 1}, but an "
                f"epoch of this run has {self.plan.steps_per_epoch} steps: its training data is smaller than the "
                f"data of the run that wrote it (--data-dir {self.cfg.data_dir}); resume on the same data, or start "
                "a new run with another --out")
        if position.step < self.plan.total_steps:
            return position
        # At the last step: a run whose summary was lost (a full disk as it was written) gets it now, from the
        # records of its epochs; rank 0 reads them and every rank goes on, or stops, with it.
        refusal = from_rank_zero(self._nothing_to_resume(position.step) if self.main else None)
        if refusal:
            raise ValueError(refusal)
        return position

    def _nothing_to_resume(self, steps: int) -> str | None:
        """Why a run resumed at its last step has nothing to do (None: its summary is to be written)."""
        folder = self.folder
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

    def prepare(self, position: Position, say: Callable[[str], None]) -> None:
        """Clear what an earlier process left (half-written files, a summary that this run will replace), after
        making sure that checkpoints can be written and that no unfinished run is deleted without ``--overwrite``;
        ``say`` tells the person watching what was skipped, resumed or replaced."""
        if not self.main:
            return
        folder, state = self.folder, self.state
        checkpoint.check_writable(folder.checkpoints)
        if not state.resumed_from:
            self._replace_earlier_run(say)
        if not self.cfg.resume:  # a new run, not another attempt at this one: the crash drill fires again
            folder.crash_drill_done.unlink(missing_ok=True)
        if self.cfg.crash_at_step is not None and not fault_drill.first_attempt(folder):
            say(f"the crash drill does not fire again: this is a restart, or an earlier attempt of this run already "
                f"crashed ({folder.crash_drill_done.name}); a new run (another --out, or --overwrite) drills again")
        checkpoint.remove_partial(folder.checkpoints)
        folder.summary.unlink(missing_ok=True)  # a folder with checkpoints and no summary holds an unfinished run
        for reason in state.skipped:
            say(f"skipped a checkpoint: {reason}")
        if state.resumed_from:
            say(f"resuming from {state.resumed_from}: step {position.step}, epoch {position.epoch + 1}, "
                f"{position.epoch_step} steps into it")
            if state.resharded_from:
                say(f"resharded: written by {state.resharded_from} ranks, continued by "
                    f"{self.setup.where.world_size} with the same global batch and sample order; "
                    "random augmentations are drawn anew")
        elif self.cfg.resume:
            say(f"no checkpoint in {folder.checkpoints} yet: starting from the beginning")

    def _replace_earlier_run(self, say: Callable[[str], None]) -> None:
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
        say(f"a new run in {folder.path}: the earlier run's checkpoints were removed")

    def stop_requested(self, at_log_point: bool) -> bool:
        """Whether SIGTERM/SIGUSR1 arrived; under DDP the ranks agree at log points, so all stop at one step."""
        received = self.signals.received is not None
        if self.setup.where.world_size == 1:
            return received
        return at_log_point and any_rank(received, self.setup.device)

    def preempt(self, step: int) -> NoReturn:
        """End the run after its checkpoint of ``step``, leaving the marker its job requeues on."""
        by = self.signals.received or "a signal on another rank"
        if self.main:
            preemption.mark(self.folder, step, by)
        raise Preempted(f"stopped by {by} after step {step}; the checkpoint is in {self.folder.checkpoints}: "
                        "continue with --resume auto")
