"""Notebook 01: the baseline's figures, the answer to "why is the first epoch slower?" read against the
measured spread, and the check of the exercise on the learner's training step.

The learner's own loop (model, data, optimizer, the timed loop) lives in the notebook's cells; this module
holds what reads its measurements and the course's run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn

from course_utils.observe.clocks import steady_median
from course_utils.observe.metrics import Run
from course_utils.observe.noise import (
    DISTURBED_CAUSE,
    MIN_SAMPLES,
    SLOWER,
    UNKNOWN,
    Measurement,
    compare,
    outside,
    spread_text,
)
from course_utils.tooling.exercises import Check, fixed_batches, tiny_cnn


def _first_iterations(its: list[float], skip: int) -> str:
    steady = Measurement.of(its[skip:])
    first = compare(Measurement.once(1 / its[0]), steady.inverse(), bound=(0, 1),
                    why="the first iteration does a steady one's work plus the one-time costs")
    figures = (f"- The very first iteration took **{its[0] * 1000:.0f} ms**, against a steady-state median of "
               f"**{steady.median * 1000:.1f} ms** (steady iterations: {spread_text(steady)}); its speed against "
               f"the steady state's: {first.sentence()}")
    if first.verdict == SLOWER:
        return f"{figures} The one-time costs land there."
    return figures


def _epochs(run: Run, steady: float) -> list[str]:
    epochs = run.epochs["seconds"].tolist()
    later = Measurement.of(epochs[1:])
    first = compare(Measurement.once(1 / epochs[0]), later.inverse(), bound=(0, 1),
                    why="the first epoch does a later epoch's work plus the warm-up")
    lines = [f"- The first epoch took **{epochs[0]:.2f} s**, the later ones **{later.median:.2f} s** (median; "
             f"{spread_text(later)}); its speed against theirs: {first.sentence()}"]
    if first.verdict == SLOWER:
        lines.append(f"- Warm-up cost about **{epochs[0] - later.median:.2f} s** once, while one epoch costs "
                     f"{later.median:.2f} s every time: measure speed after warm-up, never from the first epoch.")
    elif first.verdict == UNKNOWN:
        lines.append(f"- Train {MIN_SAMPLES + 1} epochs or more to judge the first against the later ones.")
    predicted = run.summary["steps_per_epoch"] * steady
    starts = run.iterations.groupby("epoch")["seconds"].first().iloc[1:]
    cfg = run.summary.get("config", {})
    restarting = cfg.get("workers", 0) > 0 and not cfg.get("persistent_workers", False)
    cause = " (its data-loader workers start anew)" if restarting else ""
    product = (f"{run.summary['steps_per_epoch']} x {steady * 1000:.1f} ms = **{predicted:.2f} s**, against "
               f"{later.median:.2f} s measured")
    if later.known and predicted < later.low:
        lines.append(f"- An epoch is the sum of its iterations, not iterations x typical iteration: {product}. The "
                     f"difference is the slow iterations; the first of each later epoch alone took "
                     f"**{starts.mean() * 1000:.0f} ms** on average{cause}, against {steady * 1000:.1f} ms typical.")
    elif later.known and predicted > later.high:
        lines.append(f"- Iterations x typical iteration: {product}. The later epochs were shorter than that: their "
                     "iterations ran faster than the median of the whole steady run, so the machine's speed changed "
                     f"while it ran. {DISTURBED_CAUSE}.")
    else:
        lines.append(f"- Iterations x typical iteration: {product}, inside the later epochs' spread: here an epoch "
                     "costs its iterations and little else.")
    return lines


def warmup(run: Run) -> str:
    """Markdown answering "why is the first epoch slower?" with this run's numbers, each difference set
    against the spread of the measurements it compares."""
    its = run.iterations["seconds"].tolist()
    skip = run.summary["warmup_steps"]
    lines = [_first_iterations(its, skip)]
    if len(run.epochs) >= 2:
        lines += _epochs(run, steady_median(its, skip))
    lines.append(f"- Steady-state throughput, counted after the first {skip} iterations: "
                 f"**{run.summary['images_per_second']:.0f} images/s** on {run.summary['device']}.")
    return "\n".join(lines)


def work_and_peak(summary: dict) -> str:
    """Markdown: the run's arithmetic per image, and how much of the device's peak it achieved (MFU)."""
    gflops = summary["training_flops_per_image"] / 1e9
    line = f"- **{gflops:.2f} GFLOP** per training image (forward and backward, PyTorch's FLOP counter)"
    if summary["mfu"] is None:
        return (f"{line}; no MFU here: the peak of {summary['device']} is not in the course's table of "
                "vendors' peaks (`course_utils.observe.flops.PEAKS`), and is not guessed.")
    achieved = summary["images_per_second"] * gflops / 1e3
    line = (f"{line}: **{achieved:.1f} TFLOP/s** achieved, **{summary['mfu']:.0%}** of the "
            f"{summary['peak_tflops']:.0f} TFLOP/s dense peak ({summary['peak_source']})")
    if outside(summary["mfu"], 0, 1):
        return (f"{line}: above the peak, which no device reaches. A **disturbed measurement** (a clock that missed "
                "queued GPU work), or a peak in the course's table that is not this device's; not a finding.")
    return f"{line}."


Step = Callable[[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor], torch.Tensor]
PLACEMENTS = ("clears", "accumulates", "empties")  # before backward (as `step`), nowhere, between backward and step
CHECK_STEPS = 40  # long enough for gradients that add up to show what they do: first faster, then off course
EARLY_STEPS = 10
BEHAVIOURS = {
    "clears": "clears the gradients every step, as `step` does: each update follows this batch's gradient",
    "accumulates": "never clears the gradients: every step adds this batch's gradient to all the earlier ones, "
                   "so the updates grow with every step (as if the learning rate kept rising)",
    "empties": "clears the gradients after backward, before the update: the optimizer finds no gradients and "
               "the weights never change",
}


def _reference_step(order: str) -> Step:
    """The three places zero_grad can take: before backward (right), nowhere (gradients accumulate), or
    between backward and the update (the update finds no gradients)."""

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
             labels: torch.Tensor) -> torch.Tensor:
        if order == "clears":
            optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        if order == "empties":
            optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        return loss

    return step


@dataclass
class _Trained:
    """What a step did over a short training run: the weights it left, its losses, and what the check saw
    happen inside it (backward passes, updates, the gradients each update found, gradients left behind)."""

    model: nn.Module
    losses: list[float | None] = field(default_factory=list)
    backwards: int = 0
    updates: int = 0
    updates_without_gradients: int = 0
    updates_before_backward: int = 0  # updates that came before the step's backward: each on an earlier gradient
    cleared_after_update: int = 0


def _train(step: Step, steps: int = CHECK_STEPS) -> _Trained:
    model = tiny_cnn(classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trained = _Trained(model)
    first = next(model.parameters())

    def counted_backward(_: torch.Tensor) -> None:
        trained.backwards += 1

    def counted_update(*_: object) -> None:
        trained.updates += 1
        trained.updates_without_gradients += all(p.grad is None or not p.grad.any() for p in model.parameters())
        trained.updates_before_backward += trained.backwards == backwards_before_step


    first.register_post_accumulate_grad_hook(counted_backward)
    optimizer.register_step_pre_hook(counted_update)
    batches = fixed_batches(4, classes=10)
    for i in range(steps):
        backwards_before_step = trained.backwards
        loss = step(model, optimizer, *batches[i % len(batches)])
        trained.losses.append(_loss(loss))
        trained.cleared_after_update += first.grad is None or not first.grad.any()
    return trained


@functools.cache
def _references(steps: int) -> dict[str, _Trained]:
    return {order: _train(_reference_step(order), steps) for order in PLACEMENTS}


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(a.state_dict().values(),
                                                                          b.state_dict().values()))


def _loss(value: object) -> float | None:
    return None if value is None else float(value.detach() if isinstance(value, torch.Tensor) else value)


def _losses(mine: _Trained, right: _Trained) -> str:
    """A sentence: the losses at step 1, after the first steps and at the end, the learner's beside the right
    step's, with what their comparison shows."""
    early, last = EARLY_STEPS - 1, len(right.losses) - 1
    if None in mine.losses:
        return "Your step returns no loss: return it, as `step` does."
    said = (f"Your loss went from {mine.losses[0]:.2f} to **{mine.losses[early]:.2f}** after {early + 1} steps "
            f"and **{mine.losses[last]:.2f}** after {last + 1}; with the gradients cleared: "
            f"{right.losses[early]:.2f} and {right.losses[last]:.2f}")
    climbed = mine.losses[last] > mine.losses[0]
    if climbed and mine.losses[early] < right.losses[early]:
        return f"{said}: it fell faster at first, then climbed above where it started."
    return f"{said}: it climbed above where it started." if climbed else f"{said}."


def check_zero_grad(step: Step, steps: int = CHECK_STEPS) -> Check:
    """Train a tiny CNN on four fixed batches with ``step`` and with the three placements of ``zero_grad``;
    the learner's weights must equal one placement's exactly, and only the two moved placements are done.
    What the check sees inside the step (backward passes, updates, the gradients each update finds) names a
    wrong edit: no update at all, zero_grad moved after the update, or another change besides zero_grad."""
    try:
        mine = _train(step, steps)
    except RuntimeError as error:
        said = str(error).splitlines()[0]
        if "modified by an inplace operation" in said:
            return Check(False, "your step failed: `optimizer.step()` ran between the forward pass and "
                                "`loss.backward()`, and changed in place the weights backward still needed "
                                f"(PyTorch: \"{said[:120]}...\"). Put `optimizer.step()` back after `backward()` and "
                                "move only the `zero_grad` line.")
        return Check(False, f"your step failed: {type(error).__name__}: {said}")
    references = _references(steps)
    losses = _losses(mine, references["clears"])
    only_zero_grad = "Start again from the cell's code and move only the `zero_grad` line."
    if mine.updates == 0:
        return Check(False, "nothing was updated: your step never calls `optimizer.step()`, so the weights stayed "
                            f"where they started. Put `optimizer.step()` back and move only the `zero_grad` line. "
                            f"{losses}")
    if mine.backwards == 0:
        return Check(False, "nothing was updated: your step never calls `loss.backward()`, so the optimizer found "
                            f"no gradients. Put `loss.backward()` back and move only the `zero_grad` line. {losses}")
    matched = next((order for order in PLACEMENTS if _same(mine.model, references[order].model)), None)
    if mine.updates_before_backward:
        early = mine.updates_before_backward
        return Check(False, f"your step calls `optimizer.step()` before `loss.backward()` ({early} of "
                            f"{mine.updates} updates came before their step's backward): each update uses the "
                            "gradients left from before, or none. Put `optimizer.step()` back after `backward()` and "
                            f"move only the `zero_grad` line. {losses}")
    if matched == "clears" and mine.cleared_after_update == steps:
        return Check(False, "your step clears the gradients after `optimizer.step()`: the next backward still "
                            "starts from zero, so it trains exactly as `step` does. Leave `zero_grad` out, or put "
                            f"it between `backward()` and `step()`. {losses}")
    if matched == "clears":
        return Check(False, f"your step {BEHAVIOURS['clears']}. Move the `zero_grad` line and run the cells again. "
                            f"{losses}")
    if matched is None:
        return Check(False, "your step trains differently from every placement of `zero_grad`, so something else "
                            f"changed too: the learning rate, the loss, the order of the calls? {only_zero_grad} "
                            f"{losses}")
    if matched == "empties" and mine.updates_without_gradients < mine.updates:
        return Check(False, "your weights never changed although the optimizer found gradients: something else "
                            f"stops the update (a learning rate of 0?). {only_zero_grad} {losses}")
    return Check(True, f"your step {BEHAVIOURS[matched]}. {losses}")


def iteration_times(run: Run) -> Figure:
    """Every iteration's time, epochs shaded alternately: warm-up spikes stand out at a glance."""
    fig, ax = plt.subplots(figsize=(9, 3.5))
    its = run.iterations
    ax.plot(its["step"], its["seconds"] * 1000, lw=0.8, label="iteration")
    ax.plot(its["step"], its["data_seconds"] * 1000, lw=0.8, alpha=0.7, label="waiting for data")
    for epoch, group in its.groupby("epoch"):
        if epoch % 2 == 0:
            ax.axvspan(group["step"].min() - 0.5, group["step"].max() + 0.5, color="0.92", zorder=0)
    ax.set_yscale("log")
    ax.set(xlabel="iteration (shaded: every other epoch)", ylabel="milliseconds (log scale)",
           title=f"Time per iteration: {run.summary.get('config', {}).get('model', '')} on "
                 f"{run.summary.get('device', '')}")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


def epoch_times(run: Run) -> Figure:
    """Training time of each epoch (evaluation excluded), the first one highlighted."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    epochs = run.epochs
    colors = ["tab:red"] + ["tab:blue"] * (len(epochs) - 1)
    ax.bar(epochs["epoch"], epochs["seconds"], color=colors)
    ax.set(xlabel="epoch", ylabel="seconds", title="Training time per epoch (first in red)")
    ax.set_xticks(epochs["epoch"])
    fig.tight_layout()
    return fig


def learning_curves(run: Run) -> Figure:
    """Training loss at every log point and test accuracy after every epoch."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 3.5))
    loss_ax.plot(run.steps["step"], run.steps["loss"], label="train (logged steps)")
    loss_ax.plot(run.epochs["step"], run.epochs["test_loss"], "o-", label="test (per epoch)")
    loss_ax.set(xlabel="iteration", ylabel="cross-entropy loss", title="Loss")
    loss_ax.legend()
    acc_ax.plot(run.epochs["epoch"], run.epochs["test_top1"], "o-", label="top-1")
    acc_ax.plot(run.epochs["epoch"], run.epochs["test_top5"], "s--", label="top-5")
    acc_ax.axhline(1.0, color="0.5", lw=0.8, ls=":", label="chance (top-1)")
    acc_ax.set(xlabel="epoch", ylabel="test accuracy (%)", title="Accuracy", ylim=(0, 100))
    acc_ax.set_xticks(run.epochs["epoch"])
    acc_ax.legend()
    fig.tight_layout()
    return fig
