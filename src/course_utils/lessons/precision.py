"""Notebook 05: the precision-and-compilation progression measured stage by stage, the course's own step
timed beside the learner's, the answer and figures that read them, and the check of the exercise on the
GradScaler.

Each stage adds one technique to the stages before it and trains the same model on the same data with the
same seed. A stage the device cannot do, or cannot do usefully, stays in the table as "not available on
<device>: <reason>" and is left out of the stages after it. Every stage reads its data with the ``gpu-aug``
loader (notebook 04), on NVIDIA and AMD GPUs alike: its loader only indexes uint8 arrays and its augmentation
is a few batched operations on the device, where a per-sample CPU pipeline could cap the faster stages and
hide what they buy.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure
from torch import nn

from course_utils import config, devices
from course_utils.experiments.reference import Goal
from course_utils.experiments.runs import Variant
from course_utils.lessons.monitoring import measure_setting
from course_utils.observe.metrics import load_run
from course_utils.observe.noise import FASTER, UNKNOWN, Measurement, compare, outside, spread_text
from course_utils.tooling.exercises import Check, fixed_batches, tiny_cnn
from course_utils.train import train

STAGE_EPOCHS = {"ci": 1, "workshop": 3}  # epochs each stage trains


def stage_epochs(size: str | None = None) -> int:
    """Epochs each stage of the progression trains at the active course size (or at ``size``)."""
    return STAGE_EPOCHS[config.get_size(size).name]


def interleaved_rates(mine: Callable[[], float], model: str, batch_size: int, amp: str, steps: int,
                      rounds: int = 3) -> tuple[list[float], list[float]]:
    """Images per second of the learner's step (``mine`` times one round) and of the course's own training step
    (``train_step``) on one fixed batch in ``amp``, in alternating rounds (yours, the course's, yours, ...): a
    change of the machine's load falls on both, where two measurements one after the other would read it as a
    difference between the steps."""
    yours: list[float] = []
    row = measure_setting(model, batch_size, steps, rounds=rounds, monitor_backend="cpu", amp=amp,
                          before_round=lambda: yours.append(mine()))
    return yours, row["rates"]


STRICT, BASELINE = "fp32, strict (no TF32)", "fp32 baseline"
# A stage is a Variant: its name, the training options it adds, and two flags the progression reads (not training
# options): kept=False, a side step whose options the stages after it do not keep (fp16 instead of bf16), and
# strict_fp32=True, fp32 off the TF32 tensor cores, as an MI250X always computes it.
FLAGS = ("kept", "strict_fp32")
STAGES = (
    Variant(STRICT, kept=False, strict_fp32=True),
    Variant(BASELINE),
    Variant("+ bf16 autocast", amp="bf16"),
    Variant("+ channels_last", channels_last=True),
    Variant("+ fused optimizer", fused_optimizer=True),
    # After the fused optimizer: the GradScaler hands its scale to the fused kernel, which skips an overflowing
    # step on the device; with the default optimizer its step reads the inf check back to the host (a sync).
    Variant("fp16 + GradScaler instead of bf16", amp="fp16", kept=False),
    Variant("+ torch.compile", compile="default"),
    Variant("+ CUDA graphs (compile reduce-overhead)", compile="reduce-overhead"),
)


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
    return {"stage": stage.name, "status": "ok", "builds_on": base,
            "options": ", ".join(f"{k}={v}" for k, v in options.items()) or ("strict fp32" if strict(stage)
                                                                             else "defaults")}


def _speedups(rows: list[dict]) -> None:
    """Each row's images/s over the fp32 baseline's (PyTorch's default) and over strict fp32's, where ran."""
    rates = {row["stage"]: row.get("images_per_second") for row in rows if row.get("status") == "ok"}
    for row in rows:
        if row.get("status") == "ok":
            row["speedup"] = row["images_per_second"] / rates[BASELINE] if rates.get(BASELINE) else None
            row["speedup_over_strict"] = row["images_per_second"] / rates[STRICT] if rates.get(STRICT) else None


def run_progression(out_dir: Path, stages: Sequence[Variant] = STAGES, **train_options) -> pd.DataFrame:
    """Train every available stage and return one row per stage (notebook 05: whole epochs, so that the losses
    can be compared too)."""
    # The lesson's own folders; every stage monitored, for its energy per image where the device reports power.
    train_options = {"loader": PROGRESSION_LOADER, "overwrite": True, "monitor": "auto", **train_options}
    device = devices.default_device()
    device_label = devices.device_name(device)
    rows = []
    model = train_options.get("model") or _default_model(train_options)
    for number, (stage, options, base, reason) in enumerate(_stages_to_run(stages, device, model)):
        if reason:
            rows.append({"stage": stage.name, "status": f"not available on {device_label}: {reason}"})
            continue
        run_dir = Path(out_dir) / f"{number}"
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with devices.strict_fp32() if strict(stage) else contextlib.nullcontext():
            summary = train(out=str(run_dir), **train_options, **options)
        measured = load_run(run_dir).steady_rate()
        rows.append({
            **_row_base(stage, options, base), "images_per_second": summary["images_per_second"],
            "spread": measured.spread, "measured": measured,  # its steady iterations, read by the answer
            "mfu": summary["mfu"],  # of the peak for this stage's precision: a 16-bit stage is held to more
            "peak_memory_mib": summary["peak_memory_allocated_mib"],
            "joules_per_image": summary["joules_per_image"],  # None where the device reports no power
            "first_iteration_s": summary["first_iteration_seconds"][0],
            "final_train_loss": summary["final_train_loss"], "test_top1": summary["test_top1"], "run": str(run_dir),
        })
    _speedups(rows)
    return pd.DataFrame(rows)


def step_progression(model: str, batch_size: int, image_size: int, steps: int, rounds: int,
                     only: set[str] | None = None, warmup: int = 3,
                     on_row: Callable[[list[dict]], object] | None = None,
                     stages: Sequence[Variant] = STAGES) -> pd.DataFrame:
    """The progression's step timed on one fixed batch already on the device (no loader, no epochs, no
    evaluation): ``rounds`` x ``steps`` timed iterations per stage after ``warmup``, with MFU against the peak of
    the stage's precision and joules per image where the device reports power. ``only``: the labels of the
    stages to time (the others still lend their options to later ones). ``on_row`` gets the rows so far after
    each stage (a benchmark records them the moment they exist). ``stages``: in order, each keeping the options of
    the kept stages before it."""
    device = devices.default_device()
    name = devices.device_name(device)
    rows: list[dict] = []
    for stage, options, base, reason in _stages_to_run(stages, device, model, only):
        if reason:
            rows.append({"stage": stage.name, "status": f"not available on {name}: {reason}"})
        else:
            compiled = bool(options.get("compile"))  # CUDA graphs record after a few steps of their own
            with devices.strict_fp32() if strict(stage) else contextlib.nullcontext():
                measured = measure_setting(model, batch_size, steps, warmup + 3 * compiled, image_size,
                                           rounds=rounds, **options)
            row = {**_row_base(stage, options, base), **{k: v for k, v in measured.items() if k != "status"}}
            row["status"] = measured["status"]
            if measured["status"] == "ok":
                power = row.get("power_watts")
                row["joules_per_image"] = power / row["images_per_second"] if power and power == power else None
            rows.append(row)
        _speedups(rows)
        if on_row is not None:
            on_row(rows)
    return pd.DataFrame(rows)


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


def _rate(row: dict | pd.Series) -> Measurement:
    """A stage's images/s as a measurement: its steady iterations (a trained stage), or its rounds (a stage timed
    on a fixed batch)."""
    measured = row.get("measured")
    return measured if isinstance(measured, Measurement) else Measurement.of(row.get("rates") or [])


def _baseline(ran: pd.DataFrame) -> pd.Series:
    """The fp32 baseline (PyTorch's default) among the stages that ran; the first of them in older tables."""
    named = ran[ran["stage"] == BASELINE]
    return named.iloc[0] if len(named) else ran.iloc[0]


def progression_answer(table: pd.DataFrame) -> str:
    """Markdown: what each precision/compilation stage bought, each stage's speed against the stage it builds on
    (:mod:`course_utils.observe.noise`), and whether training stayed the same."""
    ran = table[table["status"] == "ok"].reset_index(drop=True)
    stages = {row["stage"]: row for row in ran.to_dict("records")}
    lines = ["Each stage's speed is the median of its steady iterations; a gain is read against both stages' "
             "spreads (the middle 80 % of their iterations)."]
    if STRICT in stages and BASELINE in stages:
        tf32 = compare(_rate(stages[BASELINE]), _rate(stages[STRICT]))
        lines.append(f"- **{BASELINE}** (PyTorch's default: convolutions in TF32) against **{STRICT}**: "
                     f"{tf32.sentence()} That is what TF32 buys before any code changes.")
    previous = None
    for current in stages.values():  # each against the stage it builds on (tables without it: the one before)
        base = stages.get(current.get("builds_on")) if "builds_on" in ran else previous
        previous = current
        if base is None:
            continue
        gain = compare(_rate(current), _rate(base))
        lines.append(f"- **{current['stage']}** ({_rate(current).median:.0f} images/s, "
                     f"{spread_text(_rate(current))}) against **{base['stage']}**: {gain.sentence()}")
    for row in table[table["status"] != "ok"].itertuples():
        lines.append(f"- **{row.stage}**: {row.status}.")
    best, baseline = ran.loc[ran["images_per_second"].idxmax()], _baseline(ran)
    overall = compare(_rate(best), _rate(baseline))
    if overall.verdict == FASTER:
        lines.append(f"- Fastest: **{best['stage']}** at **{overall.ratio:.2f}x** the fp32 baseline.")
    else:
        lines.append(f"- No stage is measurably faster than the fp32 baseline here (the best, {best['stage']}: "
                     f"{overall.sentence()})")
    impossible = ran[[outside(mfu, 0, 1) for mfu in ran["mfu"].fillna(float("nan"))]]
    for row in impossible.itertuples():
        lines.append(f"- **{row.stage}** measured an MFU of {row.mfu:.2f}, above 1, which no device reaches: a "
                     "disturbed clock, or a peak in the course's table too low for this device. Not a finding.")
    lines.append(_energy(ran, best))
    lines += _compile_cost(ran)
    lines.append(_same_training(ran))
    return "\n".join(lines)


LAUNCH_BOUND_MFU = 0.2  # an fp32 step this far below the device's peak leaves the GPU waiting for kernel launches


def _recorded_rate(row: pd.Series) -> Measurement:
    """A recorded stage's images/s over its rounds: their rates where the file keeps them, else the three rounds
    that a median, a lowest and a highest are (older files), else one figure with an unknown spread."""
    if isinstance(row.get("rates"), list):
        return Measurement.of(row["rates"])
    if row.get("rounds") == 3 and pd.notna(row.get("images_per_second_min")):
        return Measurement.of([row["images_per_second_min"], row["images_per_second"], row["images_per_second_max"]])
    return Measurement.of([row["images_per_second"]])


def _rounds_apart(row: pd.Series, base: pd.Series) -> bool:
    """Whether every round of ``row`` was faster than every round of ``base`` (too few rounds for a spread, but
    a fact about the rounds there were)."""
    lowest = min(row["rates"]) if isinstance(row.get("rates"), list) else row.get("images_per_second_min")
    highest = max(base["rates"]) if isinstance(base.get("rates"), list) else base.get("images_per_second_max")
    return pd.notna(lowest) and pd.notna(highest) and lowest > highest


def recorded_reading(rows: pd.DataFrame) -> str:
    """Markdown: what the progressions recorded on GPUs (``reference.gpu_rows("progression")``) show, each
    stage against the fp32 baseline of the same recording, through the rounds' spreads."""
    lines = []
    keys = [key for key in ("device", "date", "model", "batch_size", "image_size") if key in rows]
    for _, recording in rows.fillna({key: "" for key in keys}).groupby(keys, sort=False):
        ran = recording[recording["status"] == "ok"]
        if ran.empty:
            continue
        base = _baseline(ran)
        device, date = base["device"], base["date"]
        faster, apart, others = [], [], []
        for _, row in ran[~ran["stage"].isin([base["stage"], STRICT])].iterrows():
            verdict = compare(_recorded_rate(row), _recorded_rate(base)).verdict
            if verdict == FASTER:
                faster.append(row["stage"])
            elif verdict == UNKNOWN and _rounds_apart(row, base):
                apart.append(row["stage"])
            else:
                others.append(row["stage"])
        pixels = f", {base['image_size']} px" if base.get("image_size") else ""
        line = (f"- **{device}** ({date}; {base.get('model')}, batch {base.get('batch_size')}{pixels}, "
                f"{base.get('rounds')} rounds): fp32 at {base['images_per_second']:.0f} images/s, MFU "
                f"{base['mfu']:.2f}. Measurably faster than fp32: {', '.join(faster) or 'no stage'}")
        line += (f"; faster in every round, though {base.get('rounds')} rounds are too few for a spread: "
                 f"{', '.join(apart)}" if apart else "")
        line += f"; not shown faster: {', '.join(others) or 'none'}."
        strict = ran[ran["stage"] == STRICT]
        if len(strict):
            line += (f" Strict fp32 (no TF32): {strict.iloc[0]['images_per_second']:.0f} images/s, so TF32 alone was "
                     f"{base['images_per_second'] / strict.iloc[0]['images_per_second']:.2f}x.")
        gains = faster + apart
        if gains and base["mfu"] < LAUNCH_BOUND_MFU and all("CUDA graphs" in stage for stage in gains):
            line += (f" An fp32 step at {base['mfu']:.0%} of the peak is **launch-bound**: the GPU finishes each small "
                     "kernel before Python has queued the next, so less arithmetic per kernel (16-bit, a fused "
                     "optimizer) cannot shorten the step; only CUDA graphs, which replay the whole step without "
                     "launching its kernels one by one, helped. Where the step fills the GPU (224 px, ResNet-50) "
                     "the precision stages are what buys speed.")
        lines.append(line)
    return "\n".join(lines)


def _energy(ran: pd.DataFrame, best: pd.Series) -> str:
    """Joules per image of the baseline and of the fastest stage, or why there are none."""
    energy = ran["joules_per_image"] if "joules_per_image" in ran else pd.Series(dtype=float)
    if energy.isna().all():
        return ("- **Energy**: not measured here: this device reports no power (a CPU, or an MI250X's second GCD). "
                "With NVML or AMD SMI the table gives each stage's joules per image.")
    base = _baseline(ran)
    return (f"- **Energy**: **{best['joules_per_image']:.3f} J** per image at the fastest stage against "
            f"**{base['joules_per_image']:.3f} J** in fp32 ({base['joules_per_image'] / best['joules_per_image']:.2f}x "
            "less): a faster step at similar power costs less energy per image.")


SAME_LOSS = 0.05  # final training losses within 5 % of the baseline's: rounding, not another training
SAME_TOP1_POINTS = 3.0


def _compile_cost(ran: pd.DataFrame) -> list[str]:
    """The first iteration of the compile stage against the stage it builds on, which pays the same kernel
    search and lazy start-up: the difference is what compilation cost."""
    compiled = ran[ran["stage"].str.contains("torch.compile", regex=False)]
    if compiled.empty:
        return []
    row = compiled.iloc[0]
    position = ran.index.get_loc(compiled.index[0])  # tables without "builds_on": the stage before it
    before = (ran[ran["stage"] == row.get("builds_on")] if "builds_on" in ran
              else ran.iloc[max(0, position - 1):position])
    if before.empty:
        return []
    first, after = before.iloc[0]["first_iteration_s"], row["first_iteration_s"]
    return [f"- **torch.compile**'s first iteration took **{after:.1f} s** against {first:.1f} s for the stage it "
            f"builds on, which pays the same kernel search and start-up: about **{after - first:.1f} s** of it is "
            "compilation, paid once per process and input shape."]


def _same_training(ran: pd.DataFrame) -> str:
    """Whether the stages trained the same model, judged against fixed bars (rounding moves the final loss
    by less than :data:`SAME_LOSS`), not assumed."""
    base = _baseline(ran)
    loss_gap = (ran["final_train_loss"] - base["final_train_loss"]).abs() / base["final_train_loss"]
    top1_gap = (ran["test_top1"] - base["test_top1"]).abs()
    worst = ran.loc[(loss_gap / SAME_LOSS).combine(top1_gap / SAME_TOP1_POINTS, max).idxmax()]
    spread = (f"final training losses within **{loss_gap.max():.1%}** of the baseline's "
              f"{base['final_train_loss']:.3f}, test top-1 within **{top1_gap.max():.1f}** points")
    if loss_gap.max() <= SAME_LOSS and top1_gap.max() <= SAME_TOP1_POINTS:
        return (f"- Same training? Yes: {spread} (the bar: {SAME_LOSS:.0%} and {SAME_TOP1_POINTS:.0f} points). "
                "Lower precision changed the rounding, not what was learned.")
    return (f"- Same training? Not shown: {spread}, past the bar of {SAME_LOSS:.0%} and {SAME_TOP1_POINTS:.0f} "
            f"points; furthest is **{worst['stage']}** (loss {worst['final_train_loss']:.3f}, top-1 "
            f"{worst['test_top1']:.1f} %). Short runs spread more than long ones; with fp16, check that the "
            "GradScaler ran (an underflowing gradient stalls learning).")


def progression_speed(table: pd.DataFrame) -> Figure:
    """Images per second of every stage that ran, with its speed-up over the fp32 baseline."""
    ran = table[table["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(ran)))
    bars = ax.barh(ran["stage"], ran["images_per_second"], color="tab:blue")
    for bar, speedup in zip(bars, ran["speedup"]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {speedup:.2f}x", va="center")
    ax.invert_yaxis()
    ax.set(xlabel="images per second (steady state)", title="Precision and compilation, stage by stage")
    fig.tight_layout()
    return fig


def progression_losses(table: pd.DataFrame) -> Figure:
    """The training loss of every progression stage that ran, overlaid: the same training, faster or not."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for row in table[table["status"] == "ok"].itertuples():
        steps = load_run(row.run).steps
        ax.plot(steps["step"], steps["loss"], label=row.stage, alpha=0.85)
    ax.set(xlabel="iteration", ylabel="training loss", title="Loss curves of every stage")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


FP16_SMALLEST = 2.0 ** -24  # fp16's smallest subnormal: a gradient below half of it rounds to zero
FP16_NORMAL = 2.0 ** -14  # fp16's smallest normal number: above it fp16 keeps 11 significant bits
LATE_LOSS = 0.2  # past it, the wrong classes' gradients fall below fp16's range unless the loss is scaled
INITIAL_SCALE = 2.0 ** 16  # the GradScaler's first scale
FP16_AGREEMENT = 0.03  # fp16's rounding leaves its gradients within about 1 % of fp32's (norm); bf16's: about 7 %
SAME = 1e-3  # a learner's gradients within this of a reference pass's (norm) are that pass, computed another way


def _late_in_training() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A tiny CNN trained in fp32 until its loss on one batch is small, as late in training: its gradients
    are small, where fp16 runs out of range."""
    model = tiny_cnn()
    images, labels = fixed_batches(1)[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    for _ in range(100):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        if loss.item() < LATE_LOSS:
            break
        loss.backward()
        optimizer.step()
    return model, images, labels


Gradients = Callable[[nn.Module, torch.Tensor, torch.Tensor], list[torch.Tensor]]


def _pass(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype | None,
          scale: float = 1.0) -> list[torch.Tensor]:
    """One backward pass under autocast to ``dtype`` (None: plain fp32), the loss multiplied by ``scale`` and the
    gradients divided back: the reference passes the learner's gradients are compared with."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    with torch.autocast(images.device.type, dtype=dtype or torch.float16, enabled=dtype is not None):
        loss = nn.functional.cross_entropy(model(images), labels)
    (loss * scale).backward()
    return [parameter.grad / scale for parameter in model.parameters()]


def scaled_fp16_gradients(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
    """One fp16 backward pass with the loss scaled as the GradScaler starts (65536), the gradients divided
    back: what the optimizer would apply."""
    return _pass(model, images, labels, torch.float16, INITIAL_SCALE)


def _flat(gradients: list[torch.Tensor | None], like: list[torch.Tensor]) -> torch.Tensor | None:
    if len(gradients) != len(like) or any(g is None or g.shape != e.shape for g, e in zip(gradients, like)):
        return None
    return torch.cat([g.detach().float().flatten() for g in gradients])


def _distance(mine: torch.Tensor, reference: torch.Tensor) -> float:
    return float((mine - reference).norm() / reference.norm())


def check_underflow(fp16_gradients: Gradients) -> Check:
    """Exercise: run the learner's fp16 backward pass on a model late in training and compare its gradients
    with fp32's, element by element: where fp16 holds the fp32 gradient (above its smallest normal number)
    they must agree within fp16's rounding, and where fp16 cannot hold it (below half its smallest subnormal)
    they must be zero, as an unscaled fp16 pass leaves them. A wrong edit is named by the reference pass its
    gradients equal (fp32, the scaled pass, bf16) or by their factor to fp32's."""
    model, images, labels = _late_in_training()
    exact = _pass(model, images, labels, None)
    mine = _flat(fp16_gradients(copy.deepcopy(model), images, labels), exact)
    if mine is None:
        return Check(False, "your function must return one gradient per parameter, each of its parameter's shape, "
                            "as the cell does (`[parameter.grad for parameter in model.parameters()]`).")
    fp32 = _flat(exact, exact)
    held, lost = fp32.abs() >= FP16_NORMAL, (fp32 != 0) & (fp32.abs() < FP16_SMALLEST / 2)
    agreement, zeros = _distance(mine[held], fp32[held]), int((mine[lost] == 0).sum())
    factor = float((mine[held] * fp32[held]).sum() / fp32[held].square().sum())
    apart = f"{agreement:.1%}" if agreement < 1 else f"{agreement:.3g} times their size"
    text = (f"of the {int(lost.sum())} gradients that fp16 cannot hold (below {FP16_SMALLEST / 2:.0e}), "
            f"**{zeros}** are zero in yours; the {int(held.sum())} it holds differ from fp32's by **{apart}**")
    if agreement <= FP16_AGREEMENT and zeros == int(lost.sum()):
        return Check(True, f"{text}, fp16's rounding. Those gradients **underflowed**: their weights stop learning. "
                           "The GradScaler multiplies the loss (by 65536 to start with) so that they stay in range.")
    same = {name: _distance(mine, _flat(reference, exact)) <= SAME for name, reference in (
        ("fp32", exact), ("scaled", scaled_fp16_gradients(model, images, labels)),
        ("bf16", _pass(model, images, labels, torch.bfloat16)))}
    if same["fp32"]:
        hint = ("they are fp32's, bit for bit: the backward pass ran in fp32, where nothing underflows. Keep "
                "`torch.autocast(..., dtype=torch.float16)` and take out only the scaler.")
    elif same["scaled"]:
        hint = ("they are the scaled pass's: the loss is still multiplied by the scale before backward, which lifts "
                "the small gradients into fp16's range. Take the GradScaler out: a plain `loss.backward()`, the "
                "gradients as they are.")
    elif same["bf16"]:
        hint = ("they are a bf16 pass's: bf16 has fp32's range, so nothing underflows (and it needs no scaler). "
                "The exercise is about fp16: `dtype=torch.float16`.")
    elif factor > 100:
        hint = (f"they are **{factor:.0f}x** fp32's: the gradients of a scaled loss, not divided back. The "
                "optimizer would take steps that much too large. Take the scaler out, or divide by its scale.")
    elif factor < 0.01:
        hint = (f"they are **{1 / factor:.0f}x** smaller than fp32's: divided by the scale, but the loss was not "
                "multiplied by it. Without the scaler, return the gradients as they are.")
    else:
        hint = ("they are neither fp16's nor any reference pass's: something besides the scaler changed. Start again "
                "from the cell's code and take out only the scaler.")
    return Check(False, f"{text}: {hint}")
