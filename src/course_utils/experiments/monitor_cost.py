"""Notebook 02's question of what watching costs, and its benchmark: the monitor's cost to training, measured against
the noise floor of two plain blocks around each monitored one."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import torch

from course_utils.experiments.fixed_batch import fixed_batch_step
from course_utils.experiments.reference import Goal
from course_utils.observe.clocks import timed_rate
from course_utils.observe.monitor import Monitor
from course_utils.observe.noise import FASTER, SLOWER, Comparison, Measurement, compare
from course_utils.training.options import TrainOptions
from course_utils.training.setup import prepare

MONITOR_COST_GOAL = 0.01  # the monitor may cost at most 1 % of a training step's throughput


def monitor_cost(model: str, batch_size: int, steps: int = 150, rounds: int = 5, image_size: int = 32,
                 warmup: int = 10, make_monitor: Callable[[torch.device], Monitor] | None = None,
                 **train_options) -> pd.DataFrame:
    """What sampling the device costs training, where it can be seen: one process, one fixed batch on the
    device, and in each of ``rounds`` three blocks of ``steps`` iterations: plain, monitored, plain again. The
    two plain blocks around each monitored one show how far two identical blocks lie apart (the noise floor);
    the monitored block against their mean is the cost. ``make_monitor``: the monitor to measure (default: the
    one ``--monitor`` starts, every 0.5 s)."""
    make_monitor = make_monitor or (lambda device: Monitor("auto", 0.5, device))
    setup = prepare(TrainOptions(model=model, batch_size=batch_size, data="synthetic", train_samples=batch_size,
                                 test_samples=batch_size, workers=0, image_size=image_size, progress=False,
                                 **train_options))
    step, device = fixed_batch_step(setup), setup.device
    timed_rate(step, 1, warmup, device)
    rows = []
    for number in range(rounds):
        before, _ = timed_rate(step, steps, 0, device)
        monitor = make_monitor(device)  # opened outside the block: its set-up is paid once per run, not per step
        try:
            monitored, _ = timed_rate(step, steps, 0, device, on_timed_start=monitor.start)
        finally:
            monitor.stop()
        after, _ = timed_rate(step, steps, 0, device)
        rows.append({"round": number, "steps": steps, "plain_before": before, "monitored": monitored,
                     "plain_after": after, "samples": len(monitor.frame()), "backend": monitor.backend_name,
                     "cost": (before + after) / 2 / monitored - 1, "noise_floor": abs(before / after - 1)})
    return pd.DataFrame(rows)


def monitor_cost_reading(table: pd.DataFrame) -> tuple[Measurement, Measurement, Comparison]:
    """The monitor's cost (a share of the plain throughput) and the noise floor beside it, each over the rounds,
    and the monitored blocks' throughput against the plain ones' (:func:`course_utils.observe.noise.compare`)."""
    plain = Measurement.of(list(table["plain_before"]) + list(table["plain_after"]))
    return Measurement.of(table["cost"]), Measurement.of(table["noise_floor"]), compare(
        Measurement.of(table["monitored"]), plain)


MONITOR_COST_SOURCE = ("the course's goal for an observer that runs beside every workshop run: below the 1-2 % "
                       "that repeated GPU runs already vary by, so that watching never changes the answer")


def monitor_cost_goals(table: pd.DataFrame) -> list[Goal]:
    """The monitor's cost against its goal, judged as every comparison is (:func:`~course_utils.observe.noise.
    compare`): the monitored blocks' throughput against the plain ones' less the goal (99 % of it). Met where the
    spreads put it wholly above, missed where wholly below, not judged where they cannot tell; a monitored block
    faster than the plain ones by more than the spreads allow is a disturbed measurement, not judged either. The
    second goal says whether the rounds could tell a cost of the goal's size from none, with the noise floor (plain
    against plain) as its figure."""
    cost, floor, _ = monitor_cost_reading(table)
    plain = Measurement.of(list(table["plain_before"]) + list(table["plain_after"]))
    limit = 1 - MONITOR_COST_GOAL
    against = compare(Measurement.of(table["monitored"]), plain.scaled(limit), bound=(0, 1 / limit),
                      why="a monitored block does the plain block's work and more")
    met = {FASTER: True, SLOWER: False}.get(against.verdict)
    return [Goal("monitor's cost, share of the plain throughput", cost.median, f"at most {MONITOR_COST_GOAL:.0%}",
                 met, MONITOR_COST_SOURCE),
            Goal("noise floor (plain against plain)", floor.median, f"tells a {MONITOR_COST_GOAL:.0%} cost from none",
                 met is not None, f"monitored against {limit:.0%} of plain: {against.sentence()}")]
