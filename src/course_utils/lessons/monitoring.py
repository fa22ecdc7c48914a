"""Notebook 02: what the model x batch-size sweep (:mod:`course_utils.experiments.sweep`) and a monitored run
showed, in answers and figures, and the check of the exercise on the saturating batch.

Every answer compares a difference with the spread of the rounds it was measured in.
"""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_utils.observe.monitor import this_process_rows
from course_utils.observe.noise import Comparison, Measurement, compare
from course_utils.tooling.exercises import Check


def _fits(sweep: pd.DataFrame) -> pd.DataFrame:
    return sweep[sweep["status"] == "ok"]


def _speed_ratio(fast: pd.Series, slow: pd.Series) -> Comparison:
    """How many times faster ``fast`` trained than ``slow``, read through their rounds' spreads."""
    return compare(Measurement.of(fast["rates"]), Measurement.of(slow["rates"]))


def model_size_answer(sweep: pd.DataFrame) -> str:
    """Markdown: does a model with k times the parameters train k times slower? From a sweep."""
    fits = _fits(sweep)
    shared = [b for b in sorted(fits["batch_size"].unique())
              if fits[fits["batch_size"] == b]["model"].nunique() == sweep["model"].nunique()]
    if not shared:
        return "- No batch size fitted every model, so the models cannot be compared at the same batch."
    batch = shared[-1]
    rows = fits[fits["batch_size"] == batch].sort_values("parameters")
    lines = [f"At batch {batch}, the largest that fitted every model:"]
    for (_, small), (_, large) in zip(rows.iterrows(), rows.iloc[1:].iterrows()):
        params = large["parameters"] / small["parameters"]
        work = large["training_gflops_per_image"] / small["training_gflops_per_image"]
        speed = f"{small['model']}'s speed over its is {_speed_ratio(small, large).sentence()}"
        lines.append(f"- **{large['model']}** has **{params:.1f}x** the parameters of {small['model']} and "
                     f"**{work:.1f}x** its FLOPs per image ({large['training_gflops_per_image']:.2f} vs "
                     f"{small['training_gflops_per_image']:.2f} GFLOP per training image), and {speed} "
                     f"({large['images_per_second']:.0f} vs {small['images_per_second']:.0f} images/s, medians of "
                     f"{len(large['rates'])} rounds).")
    lines.append("Parameters count weights, not work: the work per image (FLOPs, counted by PyTorch's "
                 "`FlopCounterMode`) is set by the layers times the spatial resolution they run at. Speed follows "
                 "FLOPs once the device is full; a small model may not fill it at all.")
    return "\n".join(lines)


MEMORY_GROWTH = 0.10  # the process's resident memory moves by this much between runs of the same setting


def _memory_text(low: pd.Series, high: pd.Series) -> tuple[str, bool]:
    """The peak memory's growth between two batch sizes, and whether it is a measured growth."""
    growth = high["peak_memory_mib"] / low["peak_memory_mib"]
    if high.get("memory_source", "allocator") == "process" and abs(growth - 1) <= MEMORY_GROWTH:
        return (f"the process's memory shows **no measurable growth** ({low['peak_memory_mib']:.0f} and "
                f"{high['peak_memory_mib']:.0f} MiB: on a CPU it is the whole process, libraries and caches "
                "included, and this batch's activations are too small to show in it)"), False
    return f"peak memory grew **{growth:.1f}x**", growth > 1 + MEMORY_GROWTH


def batch_size_answer(sweep: pd.DataFrame) -> str:
    """Markdown: does a larger batch speed up as its memory use suggests? From a sweep."""
    lines, grew = [], False
    for model, rows in sweep.groupby("model", sort=False):
        fits = _fits(rows).sort_values("batch_size")
        if len(fits) < 2:
            lines.append(f"- **{model}**: fewer than two batch sizes fitted; nothing to compare.")
            continue
        low, high = fits.iloc[0], fits.iloc[-1]
        memory, measured = _memory_text(low, high)
        grew |= measured
        speed = f"throughput changed {_speed_ratio(high, low).sentence().rstrip('.')}"  # the line's end adds one
        text = (f"- **{model}**: from batch {low['batch_size']} to {high['batch_size']} "
                f"({high['batch_size'] / low['batch_size']:.0f}x), {memory} and {speed}")
        failed = rows[rows["status"] != "ok"]["batch_size"]
        text += f"; batch {failed.min()} did not fit." if len(failed) else "."
        lines.append(text)
    if grew:
        lines.append("Memory grows with the batch because activations are stored for the backward pass; "
                     "throughput grows only until the device is busy, then stays flat.")
    else:
        lines.append("No growth of memory was measured here, so this run cannot show it: on a GPU the allocator's "
                     "peak grows with the batch, because activations are stored for the backward pass.")
    return "\n".join(lines)


def timeline_reading(samples: pd.DataFrame) -> str:
    """Markdown: what a monitored run's timeline showed, training against evaluation and memory over time,
    read from its samples rather than asserted."""
    mine = this_process_rows(samples)
    training = mine[mine["phase"].str.startswith("epoch")]
    evaluation = mine[mine["phase"].str.startswith("eval")]
    busy, checking = training["utilization_percent"].mean(), evaluation["utilization_percent"].mean()
    if pd.isna(busy) or pd.isna(checking):
        lines = ["- Too few samples fell in training and in evaluation to compare them: sample more often "
                 "(`monitor_interval`) or train longer."]
    elif checking < busy - 5:
        lines = [f"- Utilization averaged **{busy:.0f} %** while training and **{checking:.0f} %** in evaluation: "
                 "evaluation is smaller work (no backward pass, no optimizer step), too little to keep the device "
                 "as busy."]
    else:
        lines = [f"- Utilization averaged **{busy:.0f} %** while training and **{checking:.0f} %** in evaluation: "
                 "here evaluation kept the device about as busy. On a CPU, PyTorch spreads even a forward pass "
                 "over every core; on a GPU, evaluation's smaller work usually shows as a drop."]
    memory = training["memory_used_mib"].dropna()
    if len(memory) >= 2:
        lines.append(f"- Memory went from **{memory.iloc[0]:.0f} MiB** at the first training sample to a peak of "
                     f"**{memory.max():.0f} MiB** and ended at {memory.iloc[-1]:.0f} MiB: on a GPU it climbs in the "
                     "first iterations and then stays flat, because PyTorch's caching allocator keeps what it once "
                     "needed instead of returning it to the device.")
    return "\n".join(lines)


MI250X_LEVELS = ("On an MI250X, power is the module's (both GCDs): about **300 W** with one GCD busy and about "
                 "**500 W** with both, against the module's **560 W** limit.")


def _work(row: pd.Series) -> str:
    mfu = f", {row['mfu']:.0%} MFU" if pd.notna(row.get("mfu")) else ""
    return f"{row['images_per_second']:.0f} images/s{mfu}"


def utilization_vs_power_answer(sweep: pd.DataFrame) -> str:
    """Markdown: is high utilization full use? Utilization beside drawn power (evidence, read against known
    busy levels) and throughput or MFU (the measure of the work done)."""
    fits = _fits(sweep).dropna(subset=["utilization_percent"])
    if fits["power_watts"].isna().all():
        notes = [note for note in fits.get("power_note", pd.Series(dtype=str)).dropna() if note]
        if notes and notes[0].startswith("secondary GCD"):
            return ("- This process runs on the **second GCD of its MI250X module**, which has no power sensor of "
                    "its own (`rocm-smi` prints `N/A (Secondary die)`): the module's power, both GCDs together, is "
                    f"reported on its partner GCD. {MI250X_LEVELS} To read it here, ask for the module's first "
                    "GCD, or watch `rocm-smi --showpower` beside the run.")
        return ("- This device reports no power (on a machine without a GPU the monitor reads the CPU, which has "
                "none), so this machine cannot answer the question: run the notebook on a GPU.")
    busy = fits[fits["utilization_percent"] >= 0.8 * fits["utilization_percent"].max()].sort_values("power_watts")
    low, high = busy.iloc[0], busy.iloc[-1]
    lines = [f"- **{low['model']}** at batch {low['batch_size']} showed **{low['utilization_percent']:.0f} %** "
             f"utilization while drawing **{low['power_watts']:.0f} W** ({_work(low)}); **{high['model']}** at "
             f"batch {high['batch_size']} showed **{high['utilization_percent']:.0f} %** and drew "
             f"**{high['power_watts']:.0f} W** ({_work(high)}); the reported limit is "
             f"{high['power_limit_watts']:.0f} W."]
    lines.append("- Utilization counts the share of time in which *some* kernel runs, however few of the compute "
                 "units it keeps busy, so both settings read as busy. Power is the evidence of how much of the chip "
                 "works: read it against the levels known for the device, not against 100 %. The measure of the "
                 "work itself is the throughput and the MFU beside it.")
    if high["power_limit_watts"] == 560:  # an MI250X module's limit (the sweep's rows do not name the device)
        lines.append(f"- {MI250X_LEVELS} Another job on the module's other GCD counts in the reading too.")
    return "\n".join(lines)


def sweep_results(sweep: pd.DataFrame) -> Figure:
    """Throughput and peak memory against batch size, one line per model; x marks out of memory."""
    fig, (speed_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    for model, rows in sweep.groupby("model", sort=False):
        fits = rows[rows["status"] == "ok"]
        line, = speed_ax.plot(fits["batch_size"], fits["images_per_second"], "o-", label=model)
        memory_ax.plot(fits["batch_size"], fits["peak_memory_mib"] / 1024, "o-", color=line.get_color(), label=model)
        for batch in rows[rows["status"] != "ok"]["batch_size"]:
            for ax in (speed_ax, memory_ax):
                ax.plot([batch], [0], "x", color=line.get_color(), markersize=10, mew=2)
    speed_ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="images per second (log scale)",
                 title="Training throughput")
    memory_ax.set(xscale="log", xlabel="batch size", ylabel="peak memory (GiB)", title="Peak memory (x: did not fit)")
    batches = sorted(sweep["batch_size"].unique())
    for ax in (speed_ax, memory_ax):
        ax.minorticks_off()
        ax.set_xticks(batches, labels=[str(b) for b in batches])
        ax.legend()
    fig.tight_layout()
    return fig


# Known sweeps, one per model, whose answers tell the typical wrong rules apart: the spread column read (a fixed
# threshold fails one of the first two), the best compared with (the next batch's gain fails the third), the
# model and the status filtered (another model's rows and an out-of-memory row are mixed in).
SATURATING = pd.DataFrame([
    *({"model": "resnet50", "status": "ok", "batch_size": b, "images_per_second": ips, "spread": 0.04}
      for b, ips in ((32, 1000.0), (128, 2950.0), (512, 3000.0), (2048, 3050.0))),
    {"model": "resnet50", "status": "out of memory", "batch_size": 4096, "images_per_second": float("nan"),
     "spread": float("nan")},
    *({"model": "resnet18", "status": "ok", "batch_size": b, "images_per_second": ips, "spread": 0.01}
      for b, ips in ((32, 1000.0), (128, 2950.0), (512, 3040.0), (2048, 3050.0))),
    *({"model": "vit_small", "status": "ok", "batch_size": b, "images_per_second": ips, "spread": 0.04}
      for b, ips in ((16, 1000.0), (32, 2000.0), (64, 2060.0), (128, 2120.0), (256, 2180.0))),
])
SATURATING_ANSWERS = {"resnet50": 128, "resnet18": 512, "vit_small": 128}


def _saturation_hint(rows: pd.DataFrame, found: int) -> str:
    """What the learner's answer on one known sweep is, when it is not the asked batch."""
    fits = rows[rows["status"] == "ok"]
    if found == fits["batch_size"].max():
        return "the largest batch that fit, not where the throughput stops growing"
    if found == fits.loc[fits["images_per_second"].idxmax(), "batch_size"]:
        return "the fastest batch; the exercise asks for the smallest whose throughput is within the spread of it"
    if found not in set(fits["batch_size"]):
        return "not a batch of this model's rows that fit: keep only its rows with status \"ok\""
    return ("a batch whose throughput is further from the best than the `spread` column allows, or a smaller one "
            "than the first within it: compare each batch with the best, not with the batch before")


def check_saturation(saturating_batch: Callable[[pd.DataFrame, str], int]) -> Check:
    """Exercise: does the learner's function find the smallest batch whose throughput is within the spread of
    the best? Tried on known sweeps (:data:`SATURATING`) whose answers tell the usual wrong rules apart."""
    for model, answer in SATURATING_ANSWERS.items():
        found = saturating_batch(SATURATING, model)
        if found != answer:
            rows = SATURATING[SATURATING["model"] == model]
            return Check(False, f"on a known sweep of {model} (spread {rows['spread'].iloc[0]:.0%}) your function "
                                f"returns batch {found}: {_saturation_hint(rows, found)}. The smallest batch within "
                                f"the spread of the best is {answer}.")
    return Check(True, f"on {len(SATURATING_ANSWERS)} known sweeps your function finds the batch where throughput "
                       "stops growing beyond the noise; the cell below reads this notebook's sweep with it.")
