"""Notebook 05's experiment and its benchmark: the precision-and-compilation progression, stage by stage, trained (the
notebook's whole epochs) or timed on one fixed batch (the benchmark's step), with the goals its recordings are held
to. Each stage adds one technique to the kept stages before it and trains the same model on the same data with the
same seed. A stage the device cannot do, or cannot do usefully, stays in the table as "not available on <device>:
<reason>" and is left out of the stages after it. Every stage reads its data with the gpu-aug loader (notebook 04),
on NVIDIA and AMD GPUs alike: its loader only indexes uint8 arrays and its augmentation is a few batched operations
on the device, where a per-sample CPU pipeline could cap the faster stages and hide what they buy."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from course_utils import config, devices
from course_utils.experiments.designs import notebook_design
from course_utils.experiments.fixed_batch import measure_setting
from course_utils.experiments.reference import Goal
from course_utils.experiments.runs import Variant, run_variants
from course_utils.observe.metrics import load_run
from course_utils.train import train

STAGE_EPOCHS = {"ci": 1, "workshop": 3}  # epochs each stage trains


def stage_epochs(size: str | None = None) -> int:
    """Epochs each stage of the progression trains at the active course size (or at ``size``)."""
    return STAGE_EPOCHS[config.get_size(size).name]


STRICT, BASELINE = "fp32, strict (no TF32)", "fp32 baseline"


# A stage is a Variant: its name, the training options it adds, and two flags the progression reads (not training
# options): kept=False, a side step whose options the stages after it do not keep (fp16 instead of bf16), and
# strict_fp32=True, fp32 off the TF32 tensor cores, as an MI250X always computes it.
FLAGS = ("kept", "strict_fp32")




def notebook_stages() -> tuple[Variant, ...]:
    """The progression's stages as notebook 05's cell ships them: the one design, which the benchmark times."""
    return tuple(notebook_design("05_mixed_precision_compile.ipynb", "stages",
                                 {"Variant": Variant, "progression": sys.modules[__name__]}))


def added_options(stage: Variant) -> dict[str, Any]:
    """The training options ``stage`` adds (its flags left out)."""
    return {name: value for name, value in stage.options.items() if name not in FLAGS}


def strict(stage: Variant) -> bool:
    return bool(stage.options.get("strict_fp32"))


PROGRESSION_LOADER = "gpu-aug"


SLOWDOWN_LIMIT = 3.0  # a precision this much slower than fp32 is no use here


def _half_precision_probe(device: torch.device, model: str, amp: str) -> str | None:
    """On a CPU, time a few ``amp`` steps against fp32: few CPUs have fast fp16 or bf16 kernels."""
    fp32, half = (measure_setting(model, 16, steps=2, warmup=1, monitor_backend="cpu", amp=precision,
                                  device=str(device))["images_per_second"] for precision in ("off", amp))
    if half * SLOWDOWN_LIMIT < fp32:
        return (f"{amp} runs, but {fp32 / half:.0f}x slower than fp32 here ({half:.0f} vs {fp32:.0f} images/s in a "
                f"probe): no fast {amp} kernels on this processor")
    return None


def unavailable(stage: Variant, device: torch.device, model: str) -> str | None:
    """Why ``stage`` cannot (usefully) run on ``device``, or None when it can."""
    options = added_options(stage)
    if strict(stage) and not devices.has_tf32(device):
        return "no TF32 here, so the fp32 baseline below is strict fp32 already"
    if options.get("amp") in ("fp16", "bf16") and device.type == "cpu":
        return _half_precision_probe(device, model, options["amp"])
    if options.get("amp") == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16 support"
    if options.get("compile"):
        if not torch._dynamo.is_dynamo_supported():
            return "torch.compile is not supported with this Python or platform"
        if device.type == "cpu" and shutil.which("g++") is None and shutil.which("c++") is None:
            return "torch.compile on a CPU needs a C++ compiler (g++)"
        if options["compile"] == "reduce-overhead" and device.type != "cuda":
            return "CUDA graphs replay recorded GPU work; there is no GPU here"
    if options.get("fused_optimizer"):
        try:
            torch.optim.SGD([torch.zeros(1, device=device, requires_grad=True)], lr=0.1, fused=True)
        except RuntimeError as error:
            return f"no fused SGD for this device ({error})"
    return None


def _stages_to_run(stages: Sequence[Variant], device: torch.device, model: str, only: set[str] | None = None):
    """Each stage with the options it trains with (its own on top of the kept stages' before it), the stage
    it builds on (None for a baseline), or the reason it cannot run here. ``only``: the labels to yield; the
    others still lend their options to the stages after them."""
    kept: dict = {}
    base = None
    for stage in stages:
        reason = unavailable(stage, device, model) if only is None or stage.name in only else None
        if reason:
            yield stage, None, None, reason
            continue
        options = {**kept, **added_options(stage)}
        if only is None or stage.name in only:
            yield stage, options, base, None
        if stage.options.get("kept", True):
            kept, base = options, stage.name


def _row_base(stage: Variant, options: dict, base: str | None) -> dict:
    return {"status": "ok", "builds_on": base,
            "options": ", ".join(f"{k}={v}" for k, v in options.items()) or ("strict fp32" if strict(stage)
                                                                             else "defaults")}


def _speedups(rows: list[dict]) -> None:
    """Each row's images/s over the fp32 baseline's (PyTorch's default) and over strict fp32's, where ran."""
    rates = {row["stage"]: row.get("images_per_second") for row in rows if row.get("status") == "ok"}
    for row in rows:
        if row.get("status") == "ok":
            row["speedup"] = row["images_per_second"] / rates[BASELINE] if rates.get(BASELINE) else None
            row["speedup_over_strict"] = row["images_per_second"] / rates[STRICT] if rates.get(STRICT) else None


def run_progression(out_dir: Path, stages: Sequence[Variant], **train_options) -> pd.DataFrame:
    """Train every available stage and return one row per stage (notebook 05: whole epochs, so that the losses
    can be compared too)."""
    # The lesson's own folders; every stage monitored, for its energy per image where the device reports power.
    train_options = {"loader": PROGRESSION_LOADER, "overwrite": True, "monitor": "auto", **train_options}
    device = devices.default_device()
    device_label = devices.device_name(device)
    model = train_options.get("model") or _default_model(train_options)
    plan = list(_stages_to_run(stages, device, model))
    planned = {stage.name: (Path(out_dir) / f"{number}", options, base, reason)
               for number, (stage, options, base, reason) in enumerate(plan)}

    def run(stage: Variant) -> dict:
        run_dir, options, base, reason = planned[stage.name]
        if reason:
            return {"status": f"not available on {device_label}: {reason}"}
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with devices.strict_fp32() if strict(stage) else contextlib.nullcontext():
            summary = train(out=str(run_dir), **train_options, **options)
        measured = load_run(run_dir).steady_rate()
        return {
            **_row_base(stage, options, base), "images_per_second": summary["images_per_second"],
            "spread": measured.spread, "measured": measured,  # its steady iterations, read by the answer
            "mfu": summary["mfu"],  # of the peak for this stage's precision: a 16-bit stage is held to more
            "peak_memory_mib": summary["peak_memory_allocated_mib"],
            "joules_per_image": summary["joules_per_image"],  # None where the device reports no power
            "first_iteration_s": summary["first_iteration_seconds"][0],
            "final_train_loss": summary["final_train_loss"], "test_top1": summary["test_top1"], "run": str(run_dir),
        }

    return run_variants([stage for stage, *_ in plan], run, desc="stages", on_row=_speedups, column="stage")


def step_progression(model: str, batch_size: int, image_size: int, steps: int, rounds: int,
                     only: set[str] | None = None, warmup: int = 3,
                     on_row: Callable[[list[dict]], object] | None = None,
                     stages: Sequence[Variant] | None = None) -> pd.DataFrame:
    """The progression's step timed on one fixed batch already on the device (no loader, no epochs, no
    evaluation): ``rounds`` x ``steps`` timed iterations per stage after ``warmup``, with MFU against the peak of
    the stage's precision and joules per image where the device reports power. ``only``: the labels of the
    stages to time (the others still lend their options to later ones). ``on_row`` gets the rows so far after
    each stage (a benchmark records them the moment they exist). ``stages``: in order, each keeping the options of
    the kept stages before it (notebook 05's by default)."""
    stages = notebook_stages() if stages is None else stages
    device = devices.default_device()
    name = devices.device_name(device)
    plan = list(_stages_to_run(stages, device, model, only))
    planned = {stage.name: (options, base, reason) for stage, options, base, reason in plan}

    def run(stage: Variant) -> dict:
        options, base, reason = planned[stage.name]
        if reason:
            return {"status": f"not available on {name}: {reason}"}
        compiled = bool(options.get("compile"))  # CUDA graphs record after a few steps of their own
        with devices.strict_fp32() if strict(stage) else contextlib.nullcontext():
            measured = measure_setting(model, batch_size, steps, warmup + 3 * compiled, image_size, rounds=rounds,
                                       **options)
        row = {**_row_base(stage, options, base), **{k: v for k, v in measured.items() if k != "status"}}
        row["status"] = measured["status"]
        if measured["status"] == "ok":
            power = row.get("power_watts")
            row["joules_per_image"] = power / row["images_per_second"] if power and power == power else None
        return row

    def recorded(rows: list[dict]) -> None:
        _speedups(rows)
        if on_row is not None:
            on_row(rows)

    return run_variants([stage for stage, *_ in plan], run, desc="stages", on_row=recorded, column="stage")


# Goals per image size, from published figures (the course's benchmark records them with its rows).
NVIDIA_RN50 = ("NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, one GPU: A100 80GB TF32 938 -> AMP 2,470 "
               "images/s (2.63x); V100, whose fp32 has no TF32, FP32 367 -> AMP 1,200 (3.26x)")


CUDA_GRAPHS = ("PyTorch blog 'Accelerating PyTorch with CUDA Graphs': 1.7x for Mask R-CNN where its step is "
               "launch-bound; the course's H100 recording of 2026-11-25: 2.17x at 32 px")


TF32_GOAL, STRICT_GOAL = 2.0, 3.0


CUDA_GRAPHS_GOAL = 1.5


def _stage_rate(ran: pd.DataFrame, label: str | None) -> float | None:
    rows = ran[ran["stage"] == label]
    return float(rows.iloc[0]["images_per_second"]) if len(rows) else None


def _goal(figure: str, value: float | None, target: float, source: str) -> Goal:
    return Goal(figure, value, f"at least {target:.1f}x", None if value is None else value >= target, source)


def progression_goals(table: pd.DataFrame, image_size: int) -> list[Goal]:
    """The progression's figures against their goals. At 224 px, where the step fills the GPU: the fastest
    16-bit stage at least 2x the TF32 baseline and 3x strict fp32 (NVIDIA's ResNet-50 gave 2.63x and 3.26x);
    on a device without TF32 the baseline is strict fp32, held to 3x. At 32 px, where ResNet-18's step is
    launch-bound: CUDA graphs at least 1.5x the eager stage they build on."""
    ran = table[table["status"] == "ok"]
    if ran.empty:
        return []
    if image_size >= 224:
        half = ran[ran["options"].str.contains("amp=", regex=False)]
        best = float(half["images_per_second"].max()) if len(half) else None
        baseline, strict = _stage_rate(ran, BASELINE), _stage_rate(ran, STRICT)

        def over(base: float | None) -> float | None:
            return best / base if best and base else None

        if strict is None and table["stage"].eq(STRICT).any():  # no TF32 here: the baseline is strict fp32
            return [_goal("fastest 16-bit stage over the fp32 baseline (strict fp32 here)", over(baseline),
                          STRICT_GOAL, NVIDIA_RN50)]
        goals = [_goal("fastest 16-bit stage over the fp32 baseline (TF32)", over(baseline), TF32_GOAL, NVIDIA_RN50)]
        if strict is not None:
            goals.append(_goal("fastest 16-bit stage over strict fp32", over(strict), STRICT_GOAL, NVIDIA_RN50))
        return goals
    graphs = ran[ran["stage"].str.contains("CUDA graphs", regex=False)]
    value = None
    if len(graphs):
        base = _stage_rate(ran, graphs.iloc[0]["builds_on"])
        value = graphs.iloc[0]["images_per_second"] / base if base else None
    return [_goal("CUDA graphs over the eager stage they build on", value, CUDA_GRAPHS_GOAL, CUDA_GRAPHS)]


def _default_model(train_options: dict) -> str:
    return config.get_size(train_options.get("size")).model
