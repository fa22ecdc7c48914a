"""Notebook 07: the learner's own DDP script beside the course's command, and DDP's experiments and answers.

The notebook writes a minimal DDP script from a cell and launches it with torchrun; rank 0 writes what
it saw (every epoch's first samples as the loader draws them, every iteration's time, every rank's weights
summed) to a JSON file, which the functions here read: whether every epoch began with the order the sampler
gives without ``set_epoch`` and the ranks kept one model (the exercise, judged against ``DistributedSampler``
itself), and whether the script and the course's
command ran at the same speed (:mod:`course_utils.observe.noise`).
The rest trains for real: DDP against one large batch, DDP's knobs, its communication, a preempted run.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.utils.data import DistributedSampler
from tqdm.auto import tqdm

from course_utils import config
from course_utils.data.loaders import shard_sampler
from course_utils.experiments.machine_shape import parallel_shape
from course_utils.experiments.modes import first_of
from course_utils.experiments.runs import (
    SCRATCH,
    Variant,
    measured_rate,
    measured_steps,
    run_ranks,
    run_variants,
    traced_ranks,
)
from course_utils.lessons.script_record import read_record
from course_utils.observe.metrics import load_run
from course_utils.observe.noise import DISTURBED, FASTER, SLOWER, Comparison, Measurement, communication_bound, compare
from course_utils.parallel.launch import launch
from course_utils.run_folder import RunFolder
from course_utils.tooling.exercises import Check, judge_launch
from course_utils.train import train
from course_utils.training import checkpoint, models
from course_utils.training.options import to_flags

WARMUP_STEPS = 2  # the first iterations of a run build caches and buffers: left out of every comparison


def sampler_order(samples: int, world: int, epoch: int, count: int, shuffle: bool = True) -> list[int]:
    """The first ``count`` samples rank 0 draws at ``epoch`` from the script's sampler (seed 0, the last
    incomplete share dropped): the exact reference the ``set_epoch`` check compares each epoch with."""
    sampler = DistributedSampler(range(samples), num_replicas=world, rank=0, shuffle=shuffle, seed=0, drop_last=True)
    sampler.set_epoch(epoch)
    return list(sampler)[:count]


def judge_set_epoch_removed(record: dict[str, Any]) -> Check:
    """With ``set_epoch`` taken out, every epoch must begin with the order the sampler shuffles at epoch 0,
    drawn by the loader from rank 0's share, and every rank must end with the same weights; any other orders or
    weights name what the script that ran did instead."""
    seen = [epoch["first_samples"] for epoch in record["epochs"]]
    if len(seen) < 2:
        return Check(False, f"the run had {len(seen)} epoch(s), too few to compare: keep the script's loop over "
                            "`range(args.epochs)`; the check launches it with --epochs 3.")
    if None in seen:
        return Check(False, f"the loader draws from another sampler (a {record['sampler']}, not the "
                            "DistributedSampler: `shuffle=True` in the DataLoader instead of `sampler=sampler`?), and "
                            "every rank sees the whole data set. Give the DataLoader `sampler=sampler` and take out "
                            "only `set_epoch`.")
    samples, world, count = record["samples"], record["world_size"], len(seen[0])
    sums = record.get("weights_sums", [])
    if len(set(sums)) > 1:
        return Check(False, f"the ranks ended with different weights (their sums: "
                            f"{', '.join(f'{value:.6g}' for value in sums)}): each trained a model of its own on its "
                            "share of the data. Keep the DDP wrap (`model = DDP(...)`): it averages the gradients, "
                            "so every rank takes the same step. Then take out only `set_epoch`.")
    shares = [set(sampler_order(samples, world, epoch, samples, shuffle)) for epoch in range(len(seen))
              for shuffle in (True, False)]
    if not all(any(set(order) <= share for share in shares) for order in seen):
        return Check(False, f"rank 0's first samples ({', '.join(map(str, seen))}) are not all in its share of the "
                            "DistributedSampler: the loader draws from another sampler (`shuffle=True` in the "
                            "DataLoader instead of `sampler=sampler`?), and every rank sees the whole data set. "
                            "Give the DataLoader `sampler=sampler` and take out only `set_epoch`.")
    asked = sampler_order(samples, world, 0, count)
    with_set_epoch = [sampler_order(samples, world, epoch, count) for epoch in range(len(seen))]
    if seen == [asked] * len(seen):
        return Check(True, f"all {len(seen)} epochs began with the same samples {asked}, the order the sampler "
                           "shuffles at epoch 0: without set_epoch it stays at epoch 0 and shuffles with the same "
                           "seed every epoch, so the model sees the batches in one fixed order.")
    if seen == with_set_epoch:
        return Check(False, f"each epoch began with a new order ({', '.join(map(str, [o[:3] for o in seen]))}...), "
                            "the one the sampler shuffles for that epoch: the script that ran still calls "
                            "`sampler.set_epoch(epoch)`. If you took it out, write the script again (run its "
                            "`%%writefile` cell) before this cell.")
    if all(order == seen[0] for order in seen) and seen[0] == sampler_order(samples, world, 0, count, shuffle=False):
        return Check(False, f"every epoch began with the same samples {seen[0]}, but that is the dataset's own "
                            "order dealt out to the ranks: your sampler does not shuffle at all (`shuffle=False`). "
                            "Keep `shuffle=True` and take out only `set_epoch`.")
    if all(order == seen[0] for order in seen):
        return Check(False, f"every epoch began with the same samples {seen[0]}, but not with the order seed 0 "
                            f"shuffles at epoch 0 ({asked}): something besides set_epoch changed (the sampler's seed, "
                            "the data?). Take out only `set_epoch`.")
    return Check(False, f"the epochs began with different samples ({', '.join(map(str, seen))}), and not those "
                        "`set_epoch(epoch)` gives either: something else changes the order between epochs. Take out "
                        "only `set_epoch`.")


def check_set_epoch_removed(script: str | Path, ranks: int, flags: Sequence[str],
                            timeout_seconds: float = 600) -> Check:
    """The check of the ``set_epoch`` exercise: launch the learner's ``script`` on ``ranks`` ranks with ``flags``
    (3 short epochs) and judge the order of every epoch against the sampler's, from the record this launch
    wrote; a record an earlier attempt left is removed first, and a failed launch is never judged."""
    script = Path(script)
    record = script.with_name(f"{script.stem}-check.json")
    return judge_launch(record, lambda: launch(ranks, str(script), *flags, "--out", str(record),
                                               timeout_seconds=timeout_seconds),
                        lambda path: judge_set_epoch_removed(read_record(path)))


def script_seconds(record: dict[str, Any]) -> list[float]:
    """Rank 0's iteration times of every epoch of the script, the first iterations of the run left out."""
    return [seconds for epoch in record["epochs"] for seconds in epoch["step_seconds"]][WARMUP_STEPS:]


def course_seconds(run: str | Path) -> list[float]:
    """Rank 0's iteration times of a run of the course's command, the first iterations left out."""
    return list(load_run(run).iterations["seconds"])[WARMUP_STEPS:]


def speed_against_course(script: list[float], course: list[float]) -> Comparison:
    """The script's iteration speed against the course command's, each from its iteration times."""
    return compare(Measurement.of(script).inverse(), Measurement.of(course).inverse())


def speed_against_course_answer(measured: Comparison) -> str:
    """Markdown: do the learner's script and the course's command run at the same speed?"""
    head = f"- Your script's speed per iteration (rank 0) over the course's command's: {measured.sentence()}"
    if measured.verdict in (FASTER, SLOWER):
        return head + ("\n- The course's command also logs, monitors and checkpoints, and the two read their data "
                       "differently; on a shared machine a burst of other work during one run does the same. Run "
                       "both cells again: a difference that stays is real.")
    return head


def ddp_answer(modes: pd.DataFrame) -> str:
    """Markdown: DDP against one device and against DataParallel, from
    :func:`course_utils.experiments.modes.compare_modes`, each figure read through the runs' spreads and
    against what the work allows (the first row of each kind, when the learner added more)."""
    one, ddp = first_of(modes, "none"), first_of(modes, "ddp")
    devices = ddp["devices"]
    speedup = compare(ddp["measured"], one["measured"], bound=(0, devices),
                      why=f"{devices} ranks do at most {devices} times one device's work")
    if speedup.verdict == DISTURBED:
        return (f"- DDP on {devices} ranks against one device: {speedup.sentence()} The single run was slowed by "
                "something else (other processes on the same cores, a frequency drop, the first run's caches), so "
                "this table says nothing about DDP.")
    lines = [f"- DDP on **{devices}** ranks: **{ddp['measured'].median:.0f}** images/s (the median step's) against "
             f"one device's {one['measured'].median:.0f} ({devices}x would be ideal): {speedup.sentence()} Each rank "
             f"ran {ddp['steps_per_rank'][0]} steps of batch {ddp['global_batch'] // devices}: the single run's work "
             f"per rank, and {devices}x the images in all."]
    # A rank does the single run's work plus the all-reduce: alone, one device cannot be slower than a rank.
    cost = compare(one["measured"], ddp["measured"].scaled(1 / devices), bound=(1, math.inf),
                   why="a DDP rank does the single run's work plus the all-reduce")
    if cost.verdict == FASTER:
        lines.append(f"- DDP's own cost, one device's speed over one rank's: {cost.sentence()} The gradient "
                     "all-reduce not hidden behind the backward pass, plus, on a CPU, the ranks sharing cores and "
                     "memory bandwidth.")
    else:
        lines.append(f"- DDP's own cost, one device's speed over one rank's: {cost.sentence()}")
    dp = first_of(modes, "dp")
    if dp is not None and dp["devices"] >= 2:
        against = compare(ddp["measured"], dp["measured"])
        lines.append(f"- DDP against DataParallel on the same GPUs: {against.sentence()} DDP runs one process per "
                     "GPU, with no weight copies per step and no gathering on GPU 0.")
    else:
        lines.append("- DataParallel needs 2 or more GPUs to compare with; notebook 06 says what it would show.")
    return "\n".join(lines)


def iterations_per_epoch(samples: int, batch: int, ranks: Sequence[int]) -> pd.DataFrame:
    """What DistributedSampler gives each rank of an epoch of ``samples``, at ``batch`` per rank."""
    rows = []
    for count in ranks:
        share = len(shard_sampler(range(samples), 0, count))
        rows.append({"ranks": count, "samples_per_rank": share, "iterations_per_rank": share // batch,
                     "global_batch": batch * count, "images_per_epoch": share // batch * batch * count})
    return pd.DataFrame(rows)


def _difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    floats = [name for name in a if a[name].is_floating_point()]
    absolute = max((a[n] - b[n]).abs().max().item() for n in floats)
    scale = max(b[n].abs().max().item() for n in floats)
    return {"max_abs_difference": absolute, "relative_to_largest_weight": absolute / scale}


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(RunFolder(out).last_checkpoint)["model"]


ROUNDING_SHARE = 0.01  # of the control's difference: below it, two trainings differ by float rounding only


def ddp_equals_large_batch(models: Sequence[str] = ("small_cnn_gn", "small_cnn"), nproc: int | None = None,
                           batch: int = 16, steps: int = 8, out: str | Path | None = None,
                           **options: Any) -> pd.DataFrame:
    """Parameters after ``steps`` steps: DDP on ``nproc`` ranks at ``batch`` each against one process
    at ``nproc * batch``, and against one process at ``batch`` (a different training, as a control).

    "Equal" is measured against the control, not a fixed tolerance: float32 sums in another order (a rank's
    share, then the all-reduce) drift apart by 1e-7 to 1e-4 of the weights over a few steps, depending on the
    device and the step count, while a real change of the training (the control: half the batch) moves them by
    percents. Below :data:`ROUNDING_SHARE` of the control's difference, the two trainings are the same.

    Augmentation is off so that both see the same pixels; the shared sampler order (see
    :func:`course_utils.data.shard_sampler`) makes the images of each step the same set.
    """
    shape = parallel_shape()
    nproc = nproc or shape.ranks
    out = Path(out or config.runs_dir() / "ddp-equivalence")
    # Every run on the same kind of device: the comparison is of arithmetic, not of hardware.
    common = {"max_steps": steps, "augment": False, "workers": 0, "seed": 0, "device": shape.device, **SCRATCH,
              **options}
    rows = []
    for model in tqdm(models, desc="models", unit="model"):
        run_ranks(nproc, out / f"{model}-ddp", model=model, batch_size=batch, **common)
        train(**common, model=model, batch_size=batch * nproc, out=out / f"{model}-large")
        train(**common, model=model, batch_size=batch, out=out / f"{model}-small")
        ddp = _weights(out / f"{model}-ddp")
        large, control = (_difference(ddp, _weights(out / f"{model}-{kind}")) for kind in ("large", "small"))
        rows += equivalence_rows(model, nproc, batch, large, control)
    return pd.DataFrame(rows)


def equivalence_rows(model: str, nproc: int, batch: int, large: dict[str, float],
                     control: dict[str, float]) -> list[dict[str, Any]]:
    """The table's two rows of one model: DDP against the large batch, judged by its share of the control's
    difference, and DDP against the control itself."""
    share = large["max_abs_difference"] / control["max_abs_difference"]
    ddp = f"{nproc} ranks x batch {batch}"
    return [{"model": model, "ddp": ddp, "compared_with": f"one process, batch {batch * nproc}", **large,
             "share_of_control": share, "agree": share < ROUNDING_SHARE, "control": False},
            {"model": model, "ddp": ddp, "compared_with": f"one process, batch {batch} (the control)", **control,
             "share_of_control": 1.0, "agree": False, "control": True}]


def ddp_knobs(settings: Sequence[Variant], nproc: int | None = None, steps: int | None = None,
              out: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """Images per second of DDP with each setting of its knobs (a :class:`Variant` each: a name and the options
    that differ), everything else equal; the first setting is the one the others are set against."""
    shape = parallel_shape()
    nproc = nproc or shape.ranks
    options.setdefault("device", shape.device)
    steps = steps or measured_steps(options.get("size"))
    out = Path(out or config.runs_dir() / "ddp-knobs")

    def run(setting: Variant) -> dict[str, Any]:
        summary = run_ranks(nproc, out / setting.folder_name, max_steps=steps, **options, **setting.options).summary
        return {"images_per_second": summary["images_per_second"],
                "steady_iteration_seconds": max(r["steady_iteration_seconds"] for r in summary["per_rank"]),
                "global_batch": summary["global_batch_size"], "measured": measured_rate(summary)}

    table = run_variants(settings, run, desc="settings", column="setting")
    table["relative"] = table["images_per_second"] / table["images_per_second"].iloc[0]
    return table


def gradient_mib(model: str, image_size: int = 32) -> float:
    """The size of ``model``'s gradients in fp32: what DDP all-reduces every step, bucket by bucket."""
    return models.parameter_table((model,), image_size)[0]["parameters"] * 4 / 2**20


def communication_profile(buckets: int = 8, nproc: int | None = None, steps: int | None = None,
                          out: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """DDP runs traced with the profiler, with PyTorch's default 25 MB buckets and with buckets small
    enough for about ``buckets`` of them: per setting, the median step's time, its communication, and
    how much of that hid behind computation (rank 0's trace; :mod:`course_utils.observe.communication`)."""
    shape = parallel_shape()
    size = config.get_size(options.get("size"))
    options = {"device": shape.device, "max_steps": steps or measured_steps(size.name), **options}
    gradients = gradient_mib(options.get("model") or size.model, options.get("image_size") or size.image_size)
    rows = []
    for index, cap in enumerate(tqdm((25.0, round(gradients / buckets, 3)), desc="bucket sizes", unit="run")):
        folder = Path(out or config.runs_dir() / "ddp-communication") / f"bucket-{index}"
        steps_table, _ = traced_ranks(nproc or shape.ranks, folder, bucket_cap_mb=cap, **options)
        rows.append({"bucket_cap_mb": cap, "gradient_mib": gradients, "buckets": max(1, math.ceil(gradients / cap)),
                     **steps_table.median().to_dict()})
    return pd.DataFrame(rows)


PACE_MS = 250.0  # each batch of the interrupted run waits this long in its loader, whatever the device's speed


def interrupted_run(out: str | Path, stop_after_step: int, stop: signal.Signals = signal.SIGUSR1,
                    **options: Any) -> dict[str, Any]:
    """Start a new run of the training command in ``out``, send it ``stop`` once a checkpoint at
    ``stop_after_step`` or later exists (as Slurm does before a time limit), and report how it ended.

    The run is paced: its loader makes every batch wait :data:`PACE_MS` in the training process (no workers),
    so that however fast the device, each step takes at least that long and the run cannot end between two
    looks at its checkpoints (a GPU trains the ``ci`` run's 40 steps in well under a second). The pace is not
    part of the training: the resumed run, which does not ask for it, continues the same training at full speed.
    """
    out = Path(out)
    folder = RunFolder(out).checkpoints
    flags = to_flags(**{**SCRATCH, "workers": 0, "input_delay_ms": PACE_MS, **options}, out=out)
    started = time.time()
    signalled = False
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a pipe nobody reads stalls a chatty run
        process = subprocess.Popen([sys.executable, "-m", "course_utils.train", *flags], stdout=log,
                                   stderr=subprocess.STDOUT, text=True)
        try:
            while process.poll() is None:
                saved = [int(path.stem.split("-")[1]) for path in folder.glob("step-*.pt")
                         if path.stat().st_mtime >= started]  # not the checkpoints of an earlier run, being removed
                if saved and max(saved) >= stop_after_step:
                    process.send_signal(stop)
                    signalled = True
                    break
                time.sleep(0.05)
            process.wait(timeout=600)
        finally:
            if process.poll() is None:  # it did not end in time, or the wait was interrupted: end it here
                process.kill()
                process.wait()
        log.seek(0)
        output = log.read()
    if not signalled and process.returncode == 0:
        raise RuntimeError(f"the run in {out} finished before a checkpoint at step {stop_after_step} or later "
                           f"appeared, so it was never stopped: ask for a checkpoint earlier in the run "
                           f"(checkpoint_every) or for more steps. Its output ended with:\n{output[-2000:]}")
    marker = RunFolder(out).preempted
    return {"exit_code": process.returncode, "signal": stop.name,
            "marker": marker.read_text().strip() if marker.exists() else None,
            "checkpoints": sorted(path.name for path in folder.glob("*.pt")), "output": output.strip()}

def equivalence_answer(table: pd.DataFrame) -> str:
    """Markdown: is DDP on N ranks the same training as one process with an N-times batch?"""
    lines = []
    for row in table.itertuples():
        if row.control:
            verdict = "a different training, the yardstick for the row above"
        else:
            verdict = (f"{row.share_of_control:.1e} of the control's difference: "
                       + ("**the same training**, apart from float rounding (the sums run in another order)"
                          if row.agree else f"**different**: more than {ROUNDING_SHARE:g} of what a real change "
                          "of the training moves"))
        lines.append(f"- **{row.model}**, {row.ddp} vs {row.compared_with}: largest difference "
                     f"**{row.max_abs_difference:.2e}** "
                     f"({row.relative_to_largest_weight:.1e} of the largest weight): {verdict}.")
    lines.append("- Without BatchNorm, DDP averages the gradients of N equal shares, which is the gradient of their "
                 "union: the large-batch gradient. With BatchNorm, each rank normalises with the statistics of its own "
                 "share, so the forward pass itself differs; SyncBatchNorm (`--sync-bn`, GPUs only) computes them over "
                 "the global batch and restores the equivalence, at the cost of one more all-reduce per layer.")
    return "\n".join(lines)


def knobs_answer(knobs: pd.DataFrame, communication: pd.DataFrame) -> str:
    """Markdown: what each DDP setting did to throughput here, read through the runs' spreads and against
    the most a communication setting can give: removing the exposed communication that ``communication``
    (:func:`communication_profile`, its default buckets) measured."""
    exposed = communication.iloc[0]["exposed_percent"] / 100
    most = communication_bound(exposed)
    base = knobs.iloc[0]
    lines = [f"- The traced runs above measured **{100 * exposed:.1f} %** of a step as exposed communication: no "
             f"communication setting can make a step more than **{most:.2f}x** faster (all of it removed)."]
    for row in knobs.iloc[1:].itertuples():
        gain = compare(row.measured, base["measured"], bound=(0, most),
                       why=f"{100 * exposed:.1f} % of the step was exposed communication")
        lines.append(f"- **{row.setting}**: {row.measured.median:.0f} images/s (the median step's) against the "
                     f"defaults' {base['measured'].median:.0f}: {gain.sentence()}")
    lines.append("- The knobs matter when communication is expensive: many small buckets cost latency, huge ones start "
                 "the all-reduce late; bucket views save a copy of every gradient; accumulation all-reduces once per N "
                 "batches.")
    return "\n".join(lines)


def communication_answer(table: pd.DataFrame, where: str, on_gpus: bool) -> str:
    """Markdown: how much of a DDP step is communication and how much of it hid, from the traced runs."""
    lines = [f"- Where the ranks ran: {where}. Each row is the median of rank 0's traced steps."]
    hidden = (table["hidden_ms"] / table["communication_ms"]).fillna(0.0)
    for row, share in zip(table.itertuples(), hidden):
        lines.append(
            f"- Buckets of **{row.bucket_cap_mb:g} MB** (about {row.buckets} for {row.gradient_mib:.1f} MiB of "
            f"gradients): a step of **{row.step_ms:.1f} ms** held **{row.communication_ms:.1f} ms** of all-reduce "
            f"({row.communication_percent:.1f} % of the step), of which **{share:.0%}** ran while computation went "
            f"on; **{row.exposed_ms:.1f} ms** ({row.exposed_percent:.1f} %) was exposed: DDP's overhead per step.")
    lines.append("- One bucket can be all-reduced only when the backward pass has produced the last gradient; "
                 "smaller buckets start as soon as their layers' gradients are ready, while the backward pass "
                 "goes on.")
    if hidden.iloc[-1] > hidden.iloc[0] + 0.1:
        lines.append(f"- Measured: the smaller buckets hid **{hidden.iloc[-1]:.0%}** of the communication against "
                     f"**{hidden.iloc[0]:.0%}** with one large bucket.")
    elif on_gpus:
        lines.append("- Measured: the smaller buckets did not hide more here; each all-reduce also has a fixed cost, "
                     "and many small ones can cost more than they hide (that is why the default is 25 MB).")
    else:
        lines.append("- Measured: the smaller buckets did not hide more here. CPU processes cannot show the overlap: "
                     "each rank's gloo thread needs the same cores that its training thread computes on, and waits "
                     "for the other rank, which shares them too. On GPUs NCCL/RCCL run on their own stream beside "
                     "the compute kernels: run this notebook on 2 or more GPUs to see the overlap.")
    return "\n".join(lines)
