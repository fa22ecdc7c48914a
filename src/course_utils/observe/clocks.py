"""Per-iteration clocks that do not slow the GPU down, and steady-state throughput (notebooks 01-08: every
run's timings, the sweeps and the triage).

On a GPU, a host clock read right after launching a step measures the launch, not the work,
and synchronising after every step to fix that would itself cost throughput. :class:`StepClock`
therefore records a CUDA event at the end of every step and reads the events only when asked,
at a log point; on the CPU it reads ``time.perf_counter``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from course_utils.devices import synchronize


class StepClock:
    """Durations between consecutive :meth:`lap` calls, measured where the work runs."""

    def __init__(self, device: torch.device) -> None:
        self.on_gpu = device.type == "cuda"
        self._marks: list = []

    def _now(self):
        if self.on_gpu:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        """Mark the start of the first step (call again after a pause such as evaluation)."""
        self._marks = [self._now()]

    def lap(self) -> None:
        """Mark the end of a step, which is also the start of the next one."""
        self._marks.append(self._now())

    def drain(self) -> list[float]:
        """Seconds of each step since the last drain; waits for the GPU to reach the last mark."""
        if len(self._marks) < 2:
            return []
        if self.on_gpu:
            self._marks[-1].synchronize()
            seconds = [a.elapsed_time(b) / 1000 for a, b in zip(self._marks, self._marks[1:])]
        else:
            seconds = [b - a for a, b in zip(self._marks, self._marks[1:])]
        self._marks = self._marks[-1:]
        return seconds


def warmup_steps(steps_per_epoch: int, epochs: int, total_steps: int) -> int:
    """How many leading iterations count as warm-up: the first epoch when there are several, else
    the first fifth of the run (at least one step when there are two or more)."""
    if epochs >= 2 and total_steps > steps_per_epoch:
        return steps_per_epoch
    return min(max(1, total_steps // 5), max(0, total_steps - 1))


def images_per_second(step_seconds: list[float], step_images: list[int], skip: int) -> float:
    """Images per second over every step after the first ``skip`` ones."""
    seconds = sum(step_seconds[skip:])
    return sum(step_images[skip:]) / seconds if seconds > 0 else float("nan")


def steady_median(step_seconds: list[float], skip: int) -> float:
    """The typical iteration after warm-up: the median of every step after the first ``skip`` (NaN for none: a
    process resumed at its run's last step times no step)."""
    return statistics.median(step_seconds[skip:] or step_seconds) if step_seconds else float("nan")


def timed_rate(step: Callable[[], int], steps: int, warmup: int, device: torch.device,
               on_timed_start: Callable[[], object] | None = None) -> tuple[float, float]:
    """Call ``step`` (which returns its image count) ``warmup`` times untimed, then ``steps`` times
    timed; returns images per second and the timed seconds. The device is synchronised on both sides
    of the timed calls, so queued GPU work counts where it was done."""
    for _ in range(warmup):
        step()
    synchronize(device)
    if on_timed_start is not None:
        on_timed_start()
    start = time.perf_counter()
    images = sum(step() for _ in range(steps))
    synchronize(device)
    seconds = time.perf_counter() - start
    return images / seconds, seconds
