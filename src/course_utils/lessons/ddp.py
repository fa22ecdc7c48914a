"""Notebook 07: the learner's own DDP script beside the course's command, and what its runs show.

The notebook writes a minimal DDP script from a cell and launches it with torchrun; rank 0 writes what
it saw (every epoch's first samples and every iteration's time) to a JSON file, which the functions
here read: whether every epoch saw the same order (the ``set_epoch`` exercise), and whether the
script and the course's command ran at the same speed within the spread measured in the notebook.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from course_utils.lessons import spread
from course_utils.observe.metrics import load_run

WARMUP_STEPS = 2  # the first iterations of a run build caches and buffers: left out of every comparison


def read_record(path: str | Path) -> dict[str, Any]:
    """What rank 0 of the learner's script wrote: world size, device, and per epoch its first samples and
    iteration times. A missing file says which cell writes it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not there: run the cell that launches the script (with --out {path})")
    return json.loads(path.read_text())


def epoch_orders(record: dict[str, Any]) -> pd.DataFrame:
    """Each epoch's first samples on rank 0, and whether they are the order of the epoch before."""
    rows, previous = [], None
    for epoch in record["epochs"]:
        rows.append({"epoch": epoch["epoch"], "first_samples": epoch["first_samples"],
                     "same_as_previous_epoch": None if previous is None else epoch["first_samples"] == previous})
        previous = epoch["first_samples"]
    return pd.DataFrame(rows)


def check_set_epoch_removed(record: dict[str, Any]) -> str:
    """The check of the ``set_epoch`` exercise: did every epoch of the run see the same order?"""
    orders = epoch_orders(record)
    if len(orders) < 2:
        return "Not checked: the run had one epoch; launch it with --epochs 3 to compare epochs."
    if orders["same_as_previous_epoch"].iloc[1:].all():
        return (f"Done: all {len(orders)} epochs began with the same samples {orders['first_samples'].iloc[0]}. "
                "Without set_epoch the sampler stays at epoch 0 and shuffles with the same seed every epoch.")
    return ("Not yet: the epochs began with different samples, so the script still calls sampler.set_epoch(epoch). "
            "Take that line out of the script, write it again and relaunch.")


def script_seconds(record: dict[str, Any]) -> list[float]:
    """Rank 0's iteration times of every epoch of the script, the first iterations of the run left out."""
    return [seconds for epoch in record["epochs"] for seconds in epoch["step_seconds"]][WARMUP_STEPS:]


def course_seconds(run: str | Path) -> list[float]:
    """Rank 0's iteration times of a run of the course's command, the first iterations left out."""
    return list(load_run(run).iterations["seconds"])[WARMUP_STEPS:]


def agreement(script: list[float], course: list[float]) -> dict[str, Any]:
    """The two runs' median iteration times, their ratio, and the spread within which the ratio is 1."""
    mine, theirs = float(np.median(script)), float(np.median(course))
    return {"script_ms": 1000 * mine, "course_ms": 1000 * theirs, "ratio": mine / theirs,
            "spread": spread.combined(spread.relative_spread(script), spread.relative_spread(course))}


def agreement_answer(measured: dict[str, Any]) -> str:
    """Markdown: do the learner's script and the course's command run at the same speed?"""
    ratio, width = measured["ratio"], measured["spread"]
    head = (f"- Your script: **{measured['script_ms']:.1f} ms** per iteration (median of rank 0); the course's "
            f"command: **{measured['course_ms']:.1f} ms**; ratio **{ratio:.2f}**, iterations of each run varied by "
            f"about ±{width:.0%} together.")
    if spread.within(ratio, width):
        return head + ("\n- **No measurable difference**: the two do the same work per step, which is the check "
                       "that your script is DDP as the course runs it.")
    slower = "your script" if ratio > 1 else "the course's command"
    return head + (f"\n- {slower} was slower by more than the spread. The course's command also logs, monitors and "
                   "checkpoints, and the two read their data differently; on a shared machine a burst of other work "
                   "during one run does the same. Run both cells again: a difference that stays is real.")


def ddp_answer(modes: pd.DataFrame) -> str:
    """Markdown: DDP against one device and against DataParallel, from
    :func:`course_utils.lessons.data_parallel.compare_modes`, each figure read against the runs' spread."""
    one = modes.iloc[0]
    ddp = modes[modes["mode"].str.startswith("DDP")].iloc[0]
    width = spread.combined(one["iteration_spread"], ddp["iteration_spread"])
    devices, efficiency = ddp["devices"], ddp["speedup"] / ddp["devices"]
    cost = ddp["steady_iteration_seconds"] / one["steady_iteration_seconds"]
    lines = [f"- Iterations of these short runs varied by about **±{width:.0%}** (one device and DDP together): "
             "differences inside that are no measurable difference."]
    if efficiency > 1 + width or cost < 1 - width:
        lines.append(f"- **Disturbed measurement**: DDP on {devices} ranks measured {ddp['speedup']:.2f}x one device "
                     f"({efficiency:.0%} of ideal) and a step {cost:.2f}x as long as the single run's. Neither can be "
                     "true: DDP does the single run's work and more per step. The single run was slowed by something "
                     "else (other processes on the same cores, a frequency drop, the first run's caches), so this "
                     "table says nothing about DDP. Run the comparison cell again on a quieter machine.")
        return "\n".join(lines)
    lines.append(f"- DDP on **{devices}** ranks: **{ddp['images_per_second']:.0f}** images/s, {ddp['speedup']:.2f}x "
                 f"one device ({efficiency:.0%} of ideal). Each rank ran {ddp['steps_per_rank'][0]} steps of batch "
                 f"{ddp['global_batch'] // devices}: the same per-rank work as the single run, and {devices}x the "
                 "images in all.")
    step = (f"**{ddp['steady_iteration_seconds'] * 1000:.1f} ms** per step on the slowest rank against "
            f"**{one['steady_iteration_seconds'] * 1000:.1f} ms** alone ({cost:.2f}x)")
    if spread.within(cost, width):
        lines.append(f"- DDP's own cost: {step}, **no measurable difference**: the all-reduce hid behind the backward "
                     "pass, or cost less than these runs vary.")
    else:
        lines.append(f"- DDP's own cost is in the iteration time: {step}: the gradient all-reduce not hidden behind "
                     "the backward pass, plus, on a CPU, the ranks sharing cores and memory bandwidth.")
    dp = modes[modes["mode"].str.startswith("DataParallel")]
    if len(dp) and dp.iloc[0]["devices"] >= 2:
        ratio = ddp["images_per_second"] / dp.iloc[0]["images_per_second"]
        verdict = ("no measurable difference" if spread.within(ratio, width)
                   else "one process per GPU, no weight copies per step, no gathering on GPU 0")
        lines.append(f"- Against DataParallel on the same GPUs, DDP is **{ratio:.2f}x** as fast: {verdict}.")
    else:
        lines.append("- DataParallel needs 2 or more GPUs to compare with; notebook 06 says what it would show.")
    return "\n".join(lines)
