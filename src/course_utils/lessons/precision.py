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

import copy
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure
from torch import nn

from course_utils import config, devices
from course_utils.lessons.exercises import Check, fixed_batches, tiny_cnn
from course_utils.lessons.monitoring import measure_setting
from course_utils.lessons.noise import measurable, spread_text
from course_utils.observe.metrics import load_run
from course_utils.train import train

STAGE_EPOCHS = {"ci": 1, "workshop": 3}  # epochs each stage trains


def stage_epochs(size: str | None = None) -> int:
    """Epochs each stage of the progression trains at the active course size (or at ``size``)."""
    return STAGE_EPOCHS[config.get_size(size).name]


def course_rates(model: str, batch_size: int, amp: str, steps: int, rounds: int = 3) -> list[float]:
    """Images per second of the course's own training step (``train_step``) on one fixed batch in ``amp``,
    one figure per round: what the learner's precision step is set beside."""
    row = measure_setting(model, batch_size, steps, rounds=rounds, monitor_backend="cpu", amp=amp)
    return row["rates"]


@dataclass(frozen=True)
class Stage:
    """One step of the progression: its name in the tables, and the training options it adds to fp32's."""

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
    return config.get_size(train_options.get("size")).model


def progression_answer(table: pd.DataFrame, spread: float) -> str:
    """Markdown: what each precision/compilation stage bought, each gain set against ``spread`` (the relative
    spread of repeated timings measured in the same notebook), and whether training stayed the same."""
    ran = table[table["status"] == "ok"].reset_index(drop=True)
    lines = [f"Repeated timings of one step spread by **{spread_text(spread)}** here: a gain inside that is no "
             "measurable difference."]
    for previous, current in zip(ran.to_dict("records"), ran.iloc[1:].to_dict("records")):
        gain = current["images_per_second"] / previous["images_per_second"]
        figures = f"{current['images_per_second']:.0f} vs {previous['images_per_second']:.0f} images/s"
        verdict = (f"{gain:.2f}x the stage before" if measurable(gain, spread) else
                   f"no measurable difference from the stage before ({gain:.2f}x)")
        lines.append(f"- **{current['stage']}**: {verdict} ({figures}).")
    for row in table[table["status"] != "ok"].itertuples():
        lines.append(f"- **{row.stage}**: {row.status}.")
    best = ran.loc[ran["images_per_second"].idxmax()]
    if measurable(best["speedup"], spread):
        lines.append(f"- Fastest: **{best['stage']}** at **{best['speedup']:.2f}x** the fp32 baseline.")
    else:
        lines.append(f"- No stage is measurably faster than the fp32 baseline here (the best, {best['stage']}, "
                     f"at {best['speedup']:.2f}x).")
    lines.append(_energy(ran, best))
    lines += _compile_cost(ran)
    lines.append(_same_training(ran))
    return "\n".join(lines)


def _energy(ran: pd.DataFrame, best: pd.Series) -> str:
    """Joules per image of the baseline and of the fastest stage, or why there are none."""
    energy = ran["joules_per_image"] if "joules_per_image" in ran else pd.Series(dtype=float)
    if energy.isna().all():
        return ("- **Energy**: not measured here: this device reports no power (a CPU, or an MI250X's second GCD). "
                "With NVML or AMD SMI the table gives each stage's joules per image.")
    base = ran.iloc[0]
    return (f"- **Energy**: **{best['joules_per_image']:.3f} J** per image at the fastest stage against "
            f"**{base['joules_per_image']:.3f} J** in fp32 ({base['joules_per_image'] / best['joules_per_image']:.2f}x "
            "less): a faster step at similar power costs less energy per image.")


SAME_LOSS = 0.05  # final training losses within 5 % of the baseline's: rounding, not another training
SAME_TOP1_POINTS = 3.0


def _compile_cost(ran: pd.DataFrame) -> list[str]:
    """The first iteration of the compile stage against the stage before it, which pays the same kernel
    search and lazy start-up: the difference is what compilation cost."""
    stages = ran["stage"].tolist()
    compiled = next((i for i, stage in enumerate(stages) if "torch.compile" in stage), None)
    if not compiled:
        return []
    before, after = ran.iloc[compiled - 1]["first_iteration_s"], ran.iloc[compiled]["first_iteration_s"]
    return [f"- **torch.compile**'s first iteration took **{after:.1f} s** against {before:.1f} s for the stage "
            f"before, which pays the same kernel search and start-up: about **{after - before:.1f} s** of it is "
            "compilation, paid once per process and input shape."]


def _same_training(ran: pd.DataFrame) -> str:
    """Whether the stages trained the same model, judged from the measured spread, not assumed."""
    base = ran.iloc[0]
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
