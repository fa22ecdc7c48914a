"""Notebook 05: what the precision-and-compilation progression (:mod:`course_utils.experiments.progression`)
showed, in an answer and figures, the reading of the progressions recorded on GPUs, the course's own step timed
beside the learner's, and the check of the exercise on the GradScaler.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.figure import Figure
from torch import nn

from course_utils.experiments.fixed_batch import measure_setting
from course_utils.experiments.progression import BASELINE, STRICT
from course_utils.observe.metrics import load_run
from course_utils.observe.noise import FASTER, UNKNOWN, Measurement, compare, outside, spread_text
from course_utils.tooling.exercises import Check, fixed_batches, tiny_cnn


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
    """A recorded stage's images/s over its rounds: their rates where the file keeps them, else what its median,
    lowest and highest were (older files: three rounds are those three, two are their lowest and highest), else
    one figure with an unknown spread."""
    if isinstance(row.get("rates"), list):
        return Measurement.of(row["rates"])
    extremes = [row.get("images_per_second_min"), row.get("images_per_second_max")]
    if row.get("rounds") in (2, 3) and all(pd.notna(value) for value in extremes):
        return Measurement.of(extremes + ([row["images_per_second"]] if row["rounds"] == 3 else []))
    return Measurement.of([row["images_per_second"]])


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
            comparison = compare(_recorded_rate(row), _recorded_rate(base))
            if comparison.verdict == FASTER:
                faster.append(row["stage"])
            elif comparison.verdict == UNKNOWN and comparison.apart == FASTER:
                apart.append(row["stage"])
            else:
                others.append(row["stage"])
        pixels = f", {float(base['image_size']):g} px" if base.get("image_size") else ""  # a float where rows lack it
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
