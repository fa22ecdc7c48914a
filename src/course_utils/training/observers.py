"""What watches a run without changing it: the progress bar, the profiler, the device monitor and the
named ranges of each step (notebooks 01-03; ``--trace`` and ``--monitor``).

Rank 0 alone draws and profiles; the first process of each node samples that node's devices (the summary
reads every node's utilization); every rank marks its ranges when a trace is on.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm.auto import tqdm

from course_utils.atomic_files import write_text_atomic
from course_utils.notebook import in_notebook
from course_utils.observe.monitor import Monitor
from course_utils.observe.profiling import Ranges, TraceSchedule, start_trace
from course_utils.run_folder import RunFolder
from course_utils.training.schedule import Plan
from course_utils.training.setup import Setup


def progress_interval() -> float:
    """Redraw often on a terminal or in a notebook; in a log file (batch jobs, CI) every 30 s."""
    return 0.1 if in_notebook() or sys.stderr.isatty() else 30.0


class Observers:
    """The observers of one run, started together and closed together (use it as a context manager)."""

    def __init__(self, setup: Setup, plan: Plan, first_step: int) -> None:
        cfg, main = setup.cfg, setup.where.is_main
        self.folder = RunFolder(cfg.out)
        self.main = main
        self.node_rank = setup.where.node_rank
        self.ranges = Ranges(enabled=cfg.trace is not None, nvtx=True)
        self.profiler = (start_trace(Path(cfg.trace), TraceSchedule().fitted(plan.total_steps), setup.device)
                         if cfg.trace and main else None)
        self.monitor = (Monitor(cfg.monitor, cfg.monitor_interval, setup.device).start()
                        if cfg.monitor and setup.where.is_node_main else None)
        self.bar = tqdm(total=plan.total_steps, initial=first_step, desc=f"{cfg.model} on {setup.device.type}",
                        unit="it", disable=not (cfg.progress and main), mininterval=progress_interval(),
                        dynamic_ncols=True)

    def __enter__(self) -> Observers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()
        if self.profiler is not None:
            self.profiler.stop()
        if self.monitor is not None:
            self.monitor.stop()
            samples = self.folder.node_monitor(self.node_rank)
            samples.parent.mkdir(parents=True, exist_ok=True)  # another node's disk may not hold the run folder
            write_text_atomic(samples, self.monitor.frame().to_csv(index=False))

    def phase(self, name: str) -> None:
        """Label the monitor's samples from now on ("epoch 2", "eval 2")."""
        if self.monitor is not None:
            self.monitor.phase(name)

    def stepped(self) -> None:
        """One optimizer step is done."""
        if self.profiler is not None:
            self.profiler.step()
        self.bar.update()

    def logged(self, loss: float, images_per_second: float) -> None:
        self.bar.set_postfix(loss=f"{loss:.3f}", img_s=f"{images_per_second:.0f}")

    def say(self, text: str) -> None:
        """A line for the person watching, printed by rank 0 without breaking the progress bar."""
        if self.main:
            tqdm.write(text)
