"""Notebook 12: a training step's memory predicted before it runs, measured step by step, the gap explained, and
the cheapest rung of notebook 09's ladder that fits a budget.

The forecast builds the model on the meta device (shapes, no memory), counts what each rank keeps between
steps (parameters, gradients and SGD's momentum, each a shard under FSDP) and runs one forward pass there,
counting what autograd saves for the backward pass with the same counter the training command measures with
(:class:`course_utils.observe.memory.SavedActivations`). The measurement trains a few real steps in this process
and reads what it holds before and after each: the optimizer's state appears at the first step, which is why a
run that fits its first forward pass can fail at its second step. On a GPU it also reads the caching allocator
(what it reserved beyond what is allocated) and records its memory history into a snapshot that PyTorch's memory
viewer (pytorch.org/memory_viz) draws.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from course_utils.experiments.ladder import MIB, how, needs_gpus, notebook_rungs
from course_utils.experiments.runs import Variant
from course_utils.observe.memory import KINDS, SavedActivations, held_bytes, measure_step
from course_utils.parallel.layout import mode_of
from course_utils.training import models
from course_utils.training.activation_checkpointing import checkpoint_blocks
from course_utils.training.options import TrainOptions, number_misfit

STATE_KINDS = KINDS[:3]  # what stays between steps: parameters, gradients, optimizer state
SNAPSHOT_ENTRIES = 100_000  # allocator events the memory history keeps (the newest)


def _options(**options: Any) -> TrainOptions:
    cfg = TrainOptions.from_keywords(**options).resolved()
    unmodelled = [name for name, value, plain in (("amp", cfg.amp, "off"), ("compile", cfg.compile, None),
                                                  ("tp_size", cfg.tp_size, None), ("offload", cfg.offload, False),
                                                  ("grad_accum", cfg.grad_accum, 1)) if value != plain]
    mode = mode_of(cfg.distributed)
    if mode.splits_layers or mode.all_gpus_in_one_process:
        unmodelled.append(f"distributed={cfg.distributed}")
    if unmodelled or cfg.data == "coco":
        raise ValueError(f"the forecast counts fp32 classifiers trained with SGD, one batch per step, on one device, "
                         f"DDP or FSDP ranks; {', '.join(unmodelled) or 'data=coco'} is outside it: leave it at its "
                         "default")
    return cfg


def _shard_bytes(parameter: torch.Tensor, ranks: int) -> int:
    """FSDP2 splits dimension 0 into ``ranks`` equal parts, the last padded: every rank keeps the padded part."""
    rows = math.ceil(parameter.shape[0] / ranks) if parameter.dim() else 1
    return rows * (parameter.numel() // max(1, parameter.shape[0] if parameter.dim() else 1)) \
        * parameter.element_size()


def _check_ranks(ranks: int) -> None:
    misfit = number_misfit("ranks", ranks, int)
    if misfit:
        raise TypeError(misfit)
    if ranks < 1:
        raise ValueError(f"ranks is the number of processes the step is spread over: at least 1, not {ranks}")


def predict_step(ranks: int = 1, **options: Any) -> dict[str, int]:
    """Bytes one rank holds for one training step of the run ``options`` describes (the training command's
    keywords: model, batch_size, distributed, activation_checkpointing...), over ``ranks`` ranks, by kind."""
    _check_ranks(ranks)
    cfg = _options(**options)
    with torch.device("meta"):
        model = models.build(cfg.model, image_size=cfg.image_size)
    sharded = mode_of(cfg.distributed).fsdp_over_all_ranks
    parameters = sum(_shard_bytes(p, ranks) if sharded else p.numel() * p.element_size()
                     for p in model.parameters() if p.requires_grad)
    recomputed = checkpoint_blocks(models.blocks(model)) if cfg.activation_checkpointing else []
    images = torch.empty(cfg.batch_size, 3, cfg.image_size, cfg.image_size, device="meta")
    labels = torch.empty(cfg.batch_size, dtype=torch.long, device="meta")
    with SavedActivations(model, recomputed) as saved:
        nn.functional.cross_entropy(model(images), labels)
    return {"parameters": parameters, "gradients": parameters,
            "optimizer_state": parameters if cfg.momentum > 0 else 0,  # SGD keeps one momentum buffer per weight
            "activations": saved.bytes}


def in_mib(kinds: dict[str, int | None]) -> dict[str, float | None]:
    return {kind: None if value is None else value / MIB for kind, value in kinds.items()}


@contextlib.contextmanager
def memory_history(snapshot: Path | None, device: torch.device) -> Iterator[None]:
    """On a GPU, record every allocation and free while inside and write them to ``snapshot`` (a pickle to drop
    on pytorch.org/memory_viz); elsewhere nothing: a CPU has no caching allocator to record."""
    if snapshot is None or device.type != "cuda":
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)
    try:
        yield
    finally:
        Path(snapshot).parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)


def _allocator(device: torch.device) -> dict[str, float | None]:
    if device.type != "cuda":
        return {"allocated_mib": None, "reserved_mib": None}
    return {"allocated_mib": torch.cuda.memory_allocated(device) / MIB,
            "reserved_mib": torch.cuda.memory_reserved(device) / MIB}


def measure_steps(steps: int = 2, device: str | torch.device = "cpu", snapshot: Path | None = None,
                  **options: Any) -> pd.DataFrame:
    """Train ``steps`` real steps of the run ``options`` describes, in this process on ``device``, on random
    images (memory does not depend on their values); one row before the first step and one after each, with
    what it held by kind in MiB, the step's saved activations and, on a GPU, its peak and the allocator's
    figures. ``snapshot``: on a GPU, where to write the allocator's memory history."""
    cfg = _options(**options)
    if mode_of(cfg.distributed).one_process_per_device:
        raise ValueError("measure_steps trains in this one process; measure DDP and FSDP ranks with the training "
                         "command (their summary's per_rank step_memory_bytes)")
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, image_size=cfg.image_size).to(device)
    recomputed = checkpoint_blocks(models.blocks(model)) if cfg.activation_checkpointing else []
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    images = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, device=device)
    labels = torch.randint(0, 100, (cfg.batch_size,), device=device)
    rows = [{"when": "before the first step", **in_mib({**held_bytes(model, optimizer), "activations": None}),
             "peak_allocated_mib": None, **_allocator(device)}]
    with memory_history(snapshot, device):
        for step in range(1, steps + 1):
            with measure_step(model, optimizer, device, recomputed) as measured:
                optimizer.zero_grad(set_to_none=False)
                nn.functional.cross_entropy(model(images), labels).backward()
                optimizer.step()
            held = measured[0].as_dict()
            peak = held.pop("peak_allocated")
            rows.append({"when": f"after step {step}", **in_mib(held),
                         "peak_allocated_mib": None if peak is None else peak / MIB, **_allocator(device)})
    return pd.DataFrame(rows)


def forecast_against_measurement(predicted: dict[str, int], measured: pd.DataFrame) -> pd.DataFrame:
    """By kind: the forecast, what was held before the first step and after the last, in MiB."""
    before, after = measured.iloc[0], measured.iloc[-1]
    rows = [{"kind": kind, "predicted_mib": predicted[kind] / MIB, "before_first_step_mib": before[kind],
             "after_last_step_mib": after[kind]} for kind in KINDS]
    table = pd.DataFrame(rows)
    total = {"kind": "total", **table.drop(columns="kind").sum(skipna=True).to_dict()}
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)


def gap_answer(comparison: pd.DataFrame, measured: pd.DataFrame) -> str:
    """Markdown: where the forecast and the measurement meet and why they part, from the figures."""
    rows = comparison.set_index("kind")
    lines = []
    for kind in KINDS:
        predicted, after = rows.loc[kind, "predicted_mib"], rows.loc[kind, "after_last_step_mib"]
        agree = abs(predicted - after) <= 0.01 * max(predicted, 1e-9)
        lines.append(f"- {kind.replace('_', ' ')}: predicted **{predicted:.2f} MiB**, measured **{after:.2f} MiB** "
                     f"after the last step ({'the same' if agree else 'they differ'}).")
    state_before = rows.loc["optimizer_state", "before_first_step_mib"]
    lines.append(f"- Before the first step the optimizer held **{state_before:.2f} MiB** and the gradients "
                 f"**{rows.loc['gradients', 'before_first_step_mib']:.2f} MiB**: SGD creates its momentum buffers, "
                 "and autograd the gradients, at the first step. A run whose first forward pass fits can still run "
                 "out of memory at step 1 or 2, when these appear beside the activations.")
    last = measured.iloc[-1]
    if last["reserved_mib"] is not None and not pd.isna(last["reserved_mib"]):
        lines.append(f"- The caching allocator reserved **{last['reserved_mib']:.1f} MiB** while **"
                     f"{last['allocated_mib']:.1f} MiB** were allocated: the rest is its cache of freed blocks, "
                     f"kept for the next step. The step's peak was **{last['peak_allocated_mib']:.1f} MiB**, above "
                     "the sum of the kinds: temporaries and the gradients of the activations live at once in the "
                     "backward pass.")
        first, later = measured.iloc[1]["peak_allocated_mib"], measured.iloc[2:]["peak_allocated_mib"].max()
        if len(measured) > 2:
            lines.append(f"- The first step peaked at **{first:.1f} MiB**, the later ones at **{later:.1f} MiB**: the "
                         "first also holds what it creates once (the optimizer's state beside its activations, "
                         "cuDNN's or MIOpen's workspaces while they try kernels).")
    else:
        lines.append("- Here the tensors live in CPU memory, which has no caching allocator to read and no peak "
                     "PyTorch tracks: the kinds above are the whole measurement. On a GPU this cell also reads "
                     "the allocator's peak and cache, and writes its memory history to a snapshot.")
    return "\n".join(lines)


def fitting_rung(budget_mib: float, ranks: int, rungs: Sequence[Variant] | None = None, on_gpus: bool = False,
                 **options: Any) -> tuple[pd.DataFrame, str | None]:
    """Each rung of notebook 09's ladder forecast per rank over ``ranks`` ranks, against ``budget_mib`` of device
    memory, and the name of the cheapest that fits (the ladder's order: each rung adds communication or
    recomputation), or None. Offload keeps the shards and optimizer state in host memory, on GPUs only."""
    rows = []
    for rung in rungs or notebook_rungs():
        if needs_gpus(rung) and not on_gpus:
            continue
        run = {**options, "distributed": "none", **rung.options}
        offloaded = run.pop("offload", False)
        kinds = predict_step(ranks=ranks if how(rung) != "none" else 1, **run)
        if offloaded:
            kinds = {**kinds, **dict.fromkeys(STATE_KINDS, 0)}
        total = sum(kinds.values()) / MIB
        rows.append({"rung": rung.name, **{f"{kind}_mib": value / MIB for kind, value in kinds.items()},
                     "total_mib": total, "fits": total <= budget_mib})
    table = pd.DataFrame(rows)
    fitting = table[table["fits"]]
    return table, (fitting["rung"].iloc[0] if len(fitting) else None)


def rung_answer(table: pd.DataFrame, chosen: str | None, budget_mib: float) -> str:
    """Markdown: which rung to take for the budget, and what the ones before it needed."""
    if chosen is None:
        return (f"No rung fits **{budget_mib:.1f} MiB**: even the last needs **{table['total_mib'].min():.1f} MiB** "
                "per rank. Lower the batch per rank, or add ranks to shard over.")
    before = table.iloc[:table["rung"].tolist().index(chosen)]
    too_big = ", ".join(f"{row.rung} ({row.total_mib:.1f} MiB)" for row in before.itertuples())
    needs = table.set_index("rung").loc[chosen, "total_mib"]
    return (f"The cheapest rung that fits **{budget_mib:.1f} MiB** per rank is **{chosen}**, at a forecast "
            f"**{needs:.1f} MiB**" + (f"; before it, {too_big} do not fit." if too_big else ": the first rung fits."))

