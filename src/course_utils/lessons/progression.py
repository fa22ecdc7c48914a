"""The precision-and-compilation progression of notebook 05, measured step by step.

Each stage adds one technique to the stages before it and trains the same model on the same
data with the same seed. A stage the device cannot do, or cannot do usefully, stays in the table
as "not available on <device>: <reason>" and is left out of the stages after it. Every stage reads
its data with the ``gpu-aug`` loader (notebook 04), on NVIDIA and AMD GPUs alike: its loader only
indexes uint8 arrays and its augmentation is a few batched operations on the device, where a
per-sample CPU pipeline could cap the faster stages and hide what they buy.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from course_utils import devices
from course_utils.config import get_size
from course_utils.lessons.sweep import measure_setting
from course_utils.train import train


@dataclass(frozen=True)
class Stage:
    label: str
    options: dict


STAGES = (
    Stage("fp32 baseline", {}),
    Stage("+ AMP fp16 (GradScaler)", {"amp": "fp16"}),
    Stage("bf16 instead of fp16", {"amp": "bf16"}),
    Stage("+ channels_last", {"channels_last": True}),
    Stage("+ fused optimizer", {"fused_optimizer": True}),
    Stage("+ torch.compile", {"compile": "default"}),
    Stage("+ CUDA graphs (compile reduce-overhead)", {"compile": "reduce-overhead"}),
)
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


def unavailable(stage: Stage, device: torch.device, model: str) -> str | None:
    """Why ``stage`` cannot (usefully) run on ``device``, or None when it can."""
    options = stage.options
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


def run_progression(out_dir: Path, stages: tuple[Stage, ...] = STAGES, **train_options) -> pd.DataFrame:
    """Train every available stage (cumulatively) and return one row per stage."""
    # The lesson's own folders; every stage monitored, for its energy per image where the device reports power.
    train_options = {"loader": PROGRESSION_LOADER, "overwrite": True, "monitor": "auto", **train_options}
    device = devices.default_device()
    device_label = devices.device_name(device)
    accumulated: dict = {}
    rows, baseline = [], None
    model = train_options.get("model")
    for number, stage in enumerate(stages):
        reason = unavailable(stage, device, model or _default_model(train_options))
        if reason:
            rows.append({"stage": stage.label, "status": f"not available on {device_label}: {reason}"})
            continue
        accumulated.update(stage.options)
        run_dir = Path(out_dir) / f"{number}"
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        summary = train(out=str(run_dir), **train_options, **accumulated)
        baseline = baseline or summary["images_per_second"]
        rows.append({
            "stage": stage.label, "status": "ok", "images_per_second": summary["images_per_second"],
            "speedup": summary["images_per_second"] / baseline,
            "mfu": summary["mfu"],  # of the peak for this stage's precision: a 16-bit stage is held to more
            "peak_memory_mib": summary["peak_memory_allocated_mib"],
            "joules_per_image": summary["joules_per_image"],  # None where the device reports no power
            "first_iteration_s": summary["first_iteration_seconds"][0],
            "final_train_loss": summary["final_train_loss"], "test_top1": summary["test_top1"],
            "options": ", ".join(f"{k}={v}" for k, v in accumulated.items()) or "defaults", "run": str(run_dir),
        })
    return pd.DataFrame(rows)


def _default_model(train_options: dict) -> str:
    return get_size(train_options.get("size")).model
