"""Notebook 06: DataParallel's phases profiled, its answers, and the check of the exercise that saves a
DataParallel model's weights so that the plain model loads them."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from course_utils import config
from course_utils.experiments.machine_shape import gpu_count
from course_utils.experiments.modes import first_of
from course_utils.experiments.runs import SCRATCH, measured_steps
from course_utils.observe import communication
from course_utils.observe.noise import DISTURBED, compare
from course_utils.observe.profiling import TRACE_FILE
from course_utils.tooling.exercises import Check
from course_utils.train import train
from course_utils.training.models import build

WRAPPER_PREFIX = "module."  # DataParallel (and DDP) keep the model as their attribute "module"


def check_plain_load(path: str | Path, model: str, trained: nn.Module) -> Check:
    """Does the file at ``path`` hold ``trained``'s weights (the model inside the wrapper, exactly) as a state
    dict that loads, strictly, into a fresh ``model`` without any wrapper?"""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        return Check(False, "the file holds more than tensors (a whole model object?), which a safe "
                            "`torch.load(..., weights_only=True)` refuses. Save a state dict: `....state_dict()`.")
    if not isinstance(saved, dict):
        return Check(False, f"the file holds a {type(saved).__name__}, not a state dict. Save `....state_dict()`.")
    wrapped = [name for name in saved if name.startswith(WRAPPER_PREFIX)]
    try:
        build(model).load_state_dict(saved, strict=True)
    except RuntimeError as error:
        if wrapped:
            return Check(False, f"{len(wrapped)} of {len(saved)} names begin with {WRAPPER_PREFIX!r} (e.g. "
                                f"{wrapped[0]!r}), the wrapper's attribute, so the plain model does not know them. "
                                "Save the wrapped model's module instead.")
        return Check(False, f"the plain model refuses these weights: {str(error).splitlines()[0]}")
    inner = trained.module if isinstance(trained, nn.DataParallel | nn.parallel.DistributedDataParallel) else trained
    other = [name for name, value in inner.state_dict().items() if not torch.equal(saved[name], value.cpu())]
    if other:
        return Check(False, f"the names fit the plain model, but {len(other)} of {len(saved)} tensors are not the "
                            f"weights of the model you wrapped (e.g. {other[0]!r}): save `dp_model`'s weights, not "
                            "those of another model.")
    return Check(True, f"all {len(saved)} tensors of the model you wrapped loaded into a plain {model}: the checkpoint "
                       "no longer depends on the wrapper, so one GPU, DDP or evaluation can read it.")


def dataparallel_profile(steps: int | None = None, out: str | Path | None = None, **options: Any
                         ) -> pd.DataFrame | None:
    """DataParallel over every visible GPU, traced with the profiler, at the per-GPU batch of
    :func:`compare_modes`: the median step's time in each of DataParallel's phases, in ms and as a share of the
    step (:func:`course_utils.observe.communication.dataparallel_phases`). None with fewer than two GPUs, where
    DataParallel calls the model directly and has no phase to measure."""
    gpus = gpu_count()
    if gpus < 2:
        return None
    size = config.get_size(options.get("size"))
    batch = options.pop("batch_size", None) or size.batch_size
    folder = Path(out or config.runs_dir() / "dataparallel-profile")
    train(**{**SCRATCH, **options}, max_steps=steps or measured_steps(size.name), batch_size=batch * gpus,
          distributed="dp", trace=str(folder / "trace"), out=folder)
    median = communication.dataparallel_phases(folder / "trace" / TRACE_FILE).median()
    phases = [name.removesuffix("_ms") for name in median.index if name != "step_ms"]
    return pd.DataFrame([{"phase": phase, "ms": median[f"{phase}_ms"],
                          "percent_of_step": 100 * median[f"{phase}_ms"] / median["step_ms"]} for phase in phases]
                        + [{"phase": "whole step", "ms": median["step_ms"], "percent_of_step": 100.0}])

def dataparallel_answer(modes: pd.DataFrame, gpus: int) -> str:
    """Markdown: what DataParallel bought over one device, and where its memory went."""
    one, dp = first_of(modes, "none"), first_of(modes, "dp")
    devices = dp["devices"]
    speedup = compare(dp["measured"], one["measured"], bound=(0, devices),
                      why=f"one process feeding {devices} device(s) does at most {devices}x one device's work")
    if gpus < 2:
        return (f"- This machine has **{gpus} GPU(s)**, so DataParallel had nothing to split: the run measures its "
                f"wrapper alone, **{dp['measured'].median:.0f}** images/s (the median step's) against "
                f"**{one['measured'].median:.0f}** without it: {speedup.sentence()} That ratio is the wrapper's own "
                "cost or the machine's noise, not a speed-up: one device has nothing to split. On 2 or more GPUs "
                "the notebook measures the real thing (on LUMI: a "
                "Jupyter session or job with 2 or more GCDs).")
    if speedup.verdict == DISTURBED:
        return (f"- DataParallel over {devices} GPUs against one GPU: {speedup.sentence()} The single-GPU run was "
                "slowed by something else (another job on the GPU, a clock drop).")
    memory = dp["peak_memory_per_device_mib"]
    others = sum(memory[1:]) / len(memory[1:])
    return "\n".join([
        f"- DataParallel over **{devices} GPUs** ran at **{dp['measured'].median:.0f}** images/s (the median "
        f"step's) against one GPU's {one['measured'].median:.0f}, where {devices}x would be ideal: "
        f"{speedup.sentence()}",
        f"- GPU 0 peaked at **{memory[0]:.0f} MiB** against **{others:.0f} MiB** on average on the others "
        f"({memory[0] / others:.2f}x): it holds the master copy of the model, gathers every output, computes the "
        "loss and reduces the gradients, while the others only hold a replica and their slice.",
        "- Every step, one Python process scatters the batch, copies the weights to every GPU, runs the replicas in "
        "threads (which take turns on the GIL) and gathers the results: that serial work grows with the GPU count.",
    ])


def dataparallel_phases_answer(phases: pd.DataFrame | None, gpus: int) -> str:
    """Markdown: where a DataParallel step goes, from :func:`dataparallel_profile`'s table, or what
    that profile would show where there are fewer than two GPUs."""
    if phases is None:
        return (f"- With **{gpus} GPU(s)** here DataParallel calls the model directly: there is no scatter, "
                "replicate or gather to profile. On 2 or more GPUs this cell traces a few DataParallel steps and "
                "tabulates the host's time in each phase of a step: *scatter* (the batch cut and copied to each GPU), "
                "*replicate* (the weights copied from GPU 0 to every GPU, in every step), *parallel_apply* (the "
                "replicas' forward passes in threads that take turns on the GIL), *gather* (the outputs back to "
                "GPU 0), and in the backward pass the gradients summed into GPU 0 and the output gradients "
                "scattered; and the GPUs' time copying between devices. Replicate and the reductions grow with the "
                "model and the GPU count and are driven by one process: that is what DDP removes. To see it, ask "
                "for 2 or more GPUs (on LUMI, a Jupyter session or job with 2 or more GCDs).")
    ms = dict(zip(phases["phase"], phases["ms"]))
    moving = sum(ms[name] for name in ("scatter", "replicate", "gather", "reduce_gradients", "scatter_gradients"))
    return "\n".join([
        f"- A DataParallel step over **{gpus} GPUs** took **{ms['whole step']:.1f} ms**. Moving data, all driven by "
        f"one process: scatter {ms['scatter']:.1f} ms, replicate {ms['replicate']:.1f} ms, gather "
        f"{ms['gather']:.1f} ms, gradients reduced into GPU 0 {ms['reduce_gradients']:.1f} ms, output gradients "
        f"scattered {ms['scatter_gradients']:.1f} ms: **{moving:.1f} ms, {100 * moving / ms['whole step']:.0f} %** of "
        f"the step (host time; the GPUs spent {ms['gpu_copies']:.1f} ms copying).",
        f"- The replicas' forward passes (parallel_apply, threads that share the GIL) took {ms['parallel_apply']:.1f} "
        "ms of the host's time.",
        "- DDP copies the model once at start-up, each rank loads its own batch and computes its own loss, and only "
        "gradients travel, all-reduced while the backward pass goes on: none of the phases above is in its step "
        "(notebook 07 measures what it pays instead).",
    ])
