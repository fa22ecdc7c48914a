"""Notebook 04: what the loader experiments (:mod:`course_utils.experiments.loaders`) showed, in an answer and
figures, and the check of the exercise on the learner's loader.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure
from torch.utils.data import DataLoader, Dataset

from course_utils import devices
from course_utils.data.datasets import SyntheticImages
from course_utils.data.loaders import DelayedCollate
from course_utils.experiments.triage import BALANCE
from course_utils.observe.noise import DISTURBED, Measurement, compare
from course_utils.tooling.exercises import Check


def loader_rate(loader: Iterable, device: torch.device, batches: int) -> float:
    """Images per second of ``batches`` batches of ``loader`` (iterator start included), each copied to
    ``device``: the IO of the triage, for a loader the learner built."""
    images = 0
    devices.synchronize(device)
    start = time.perf_counter()
    for number, (batch, _) in enumerate(loader):
        if number == batches:
            break
        images += len(batch.to(device, non_blocking=True))
    devices.synchronize(device)
    return images / (time.perf_counter() - start)


DELAY_SECONDS = 0.1  # the exercise's slow loader: every batch takes this long to make
STEP_SECONDS = 0.025  # and the model it feeds takes this long per step


class _TimedCollate:
    """The learner's collate, returning with each batch when its making began and ended: the workers read the
    machine's monotonic clock, the one the checking process reads too."""

    def __init__(self, collate: Callable[[list], object]) -> None:
        self.collate = collate

    def __call__(self, samples: list) -> tuple[object, tuple[float, float]]:
        start = time.monotonic()
        batch = self.collate(samples)
        return batch, (start, time.monotonic())


def most_at_once(spans: Iterable[tuple[float, float]]) -> int:
    """The most of ``spans`` (start, end) that were under way at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])  # an end before a start
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


def check_hidden_delay(make_loader: Callable[[Dataset, int, float], DataLoader], batches: int = 16) -> Check:
    """Exercise: does the learner's loader, each of whose batches still takes :data:`DELAY_SECONDS` to make,
    make enough batches at once to deliver one every :data:`STEP_SECONDS` (within the triage's balance)?

    What is judged is how many batches were being made at the same moment, read from when each one's making began
    and ended: the mechanism the lesson teaches, which other work on the machine cannot hide. How often batches
    then reached this process is reported beside it: on a busy machine it also measures the other work."""
    loader = make_loader(SyntheticImages(64 * batches, 16), 16, DELAY_SECONDS)
    collate = loader.collate_fn
    if not isinstance(collate, DelayedCollate) or collate.delay_seconds != DELAY_SECONDS or loader.batch_size != 16:
        return Check(False, f"your loader no longer makes batches of 16 that each take {DELAY_SECONDS * 1000:.0f} "
                            "ms: the delay stands for slow decoding, which a real pipeline cannot drop. Keep "
                            "`collate_fn=DelayedCollate(delay_seconds)` and `batch_size`, and hide the delay with "
                            "workers (`num_workers`).")
    loader.collate_fn = _TimedCollate(collate)
    iterator = iter(loader)
    next(iterator)  # the workers' start-up, paid once per epoch, is not the steady rate
    start = time.monotonic()
    spans = [next(iterator)[1] for _ in range(batches)]
    arrival = (time.monotonic() - start) / batches
    del iterator
    at_once = most_at_once(spans)
    every = DELAY_SECONDS / at_once
    made = f"up to **{at_once}** batches at once" if at_once > 1 else "**one** batch at a time"
    text = (f"with {loader.num_workers} workers your loader made {made}, each taking {DELAY_SECONDS * 1000:.0f} "
            f"ms: one every **{every * 1000:.0f} ms**, where the model needs one every {STEP_SECONDS * 1000:.0f} ms")
    if every > STEP_SECONDS * (1 + BALANCE):
        return Check(False, f"{text}: the model would wait for data. Each worker makes one batch per "
                            f"{DELAY_SECONDS * 1000:.0f} ms: how many make one every {STEP_SECONDS * 1000:.0f} ms? "
                            "Set `num_workers` and run it again.")
    delivered = (f" They reached this process every {arrival * 1000:.0f} ms" + (
        ": other work on this machine held its cores, which the workers' waiting does not need."
        if arrival > STEP_SECONDS * (1 + BALANCE) else "."))
    return Check(True, f"{text}: the workers hide the delay, and the model would not wait.{delivered}")


def _full_and_model(row: tuple) -> tuple[Measurement, Measurement]:
    """FULL's images/s and the model's alone (SYNTHETIC) in a row of :func:`course_utils.experiments.loaders.
    compare_loaders`, block by block where it kept them, else the one figure each (a spread unknown)."""
    rates = getattr(row, "rates", None)
    if isinstance(rates, dict):
        return Measurement.of(rates["full"]), Measurement.of(rates["synthetic"])
    return Measurement.of([row.full]), Measurement.of([row.synthetic])


def loaders_answer(comparison: pd.DataFrame, best_setting: dict) -> str:
    """Markdown: is the run input-bound or compute-bound, per loader, and what fixes it."""
    lines = []
    for row in comparison.itertuples():
        if str(row.verdict).startswith("not available"):
            lines.append(f"- **{row.loader}**: {row.verdict}")
            continue
        full_against_model = compare(*_full_and_model(row), bound=(0, 1),
                                     why="training with the loader does the model's work and more")
        if full_against_model.verdict == DISTURBED:
            lines.append(f"- **{row.loader}**: training with the loader measured {row.full_over_synthetic:.0%} of the "
                         f"model alone ({row.full:.0f} vs {row.synthetic:.0f} images/s): "
                         f"{full_against_model.sentence()}")
            continue
        line = (f"- **{row.loader}**: {row.verdict}; the loader alone delivers {row.io:.0f} images/s against "
                f"the model's {row.synthetic:.0f}, and training reaches **{row.full_over_synthetic:.0%}** of "
                f"what the model alone could do.")
        if row.verdict == "not overlapped":
            line += (f" Fast enough on its own, its work still adds **{row.loading_us_per_image:.0f} us** to each "
                     f"image's {1e6 / row.synthetic:.0f} us of training, because it is not hidden behind the step.")
        lines.append(line)
    setting = ", ".join(f"{k}={v}" for k, v in best_setting.items())
    lines.append(f"- Recommended DataLoader setting here (the fewest workers whose training throughput is within "
                 f"5 % of the best): {setting}.")
    return "\n".join(lines)


def plot_triage(table: pd.DataFrame) -> Figure:
    """IO, SYNTHETIC and FULL images/s side by side, one group per row of ``table`` (its "loader" or "case")."""
    ran = table.dropna(subset=["full"])
    label = "loader" if "loader" in ran else "case"
    fig, ax = plt.subplots(figsize=(8, 3.2))
    width = 0.27
    for offset, (column, name) in enumerate((("io", "IO only"), ("synthetic", "SYNTHETIC (model only)"),
                                             ("full", "FULL (training)"))):
        positions = [i + (offset - 1) * width for i in range(len(ran))]
        ax.bar(positions, ran[column], width, label=name)
    ax.set_xticks(range(len(ran)), ran[label])
    ax.set(ylabel="images per second", title="Input pipeline against model", yscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_loader_sweep(table: pd.DataFrame) -> Figure:
    """The loader alone and training with it against worker count, one line per combination of the
    other knobs: where the two panels disagree, the loader's speed is not what training gets."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    knobs = ["pin_memory", "persistent_workers", "prefetch_factor"]
    for ax, column, title in zip(axes, ("io", "full"), ("Loader alone (IO)", "Training with it (FULL)")):
        for values, rows in table[table["workers"] > 0].groupby(knobs):
            label = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in zip(knobs, values))
            ax.plot(rows["workers"], rows[column], "o-", label=label, alpha=0.8)
        for row in table[table["workers"] == 0].itertuples():
            ax.axhline(getattr(row, column), ls=":", color="0.4", label=f"no workers, pin_memory={row.pin_memory}")
        ax.set(xlabel="DataLoader workers", title=title)
        ax.set_xticks(sorted(table["workers"].unique()))
    axes[0].set(ylabel="images per second", yscale="log")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig
