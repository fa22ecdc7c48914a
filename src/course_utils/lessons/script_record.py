"""Notebooks 01, 07, 09 and 11: the record the learner's scripts write for the checks, and its reading.

Every script of the series keeps the same record from notebook 01 on (each epoch's order, times and losses, what
each rank held at the end), so that each later script differs from the one before it only by its lesson's
parallelism; the checks of 07, 09 and 11 read the one file it writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import distributed, nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, DistributedSampler

from course_utils.atomic_files import write_text_atomic
from course_utils.observe.memory import held_bytes
from course_utils.parallel.collectives import active, gather
from course_utils.parallel.sharding import group_bytes, whole_bytes
from course_utils.training import models

MIB = 2**20
FIRST_SAMPLES = 6  # how much of each epoch's order the record keeps: enough to tell two shuffles apart


class ScriptRecord:
    """What a script of the series ran, kept epoch by epoch and written once at its end by rank 0 to ``out``
    (nothing without ``--out``): the checks judge what the script did, never what it was meant to do."""

    def __init__(self, out: str | None) -> None:
        self.out = out
        self.epochs: list[dict[str, Any]] = []
        self.samples = 0
        self.sampler = ""

    def epoch(self, loader: DataLoader, seconds: list[float], losses: list[float]) -> None:
        """One epoch that ended: the first samples the loader drew (where a DistributedSampler dealt them, which
        draws the same order again from its seed and epoch), and its iterations' times and losses."""
        sampler = loader.sampler
        first = list(sampler)[:FIRST_SAMPLES] if isinstance(sampler, DistributedSampler) else None
        self.samples, self.sampler = len(loader.dataset), type(sampler).__name__
        self.epochs.append({"epoch": len(self.epochs), "first_samples": first, "step_seconds": list(seconds),
                            "losses": list(losses)})

    def write(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Gather what every rank holds now and write the record from rank 0, atomically: a collective, so every
        rank calls it (before leaving the group)."""
        if not self.out:
            return
        every_rank = gather(_rank_state(model, optimizer))
        if not active() or distributed.get_rank() == 0:
            write_text_atomic(Path(self.out), json.dumps(self._whole(model, every_rank)))

    def _whole(self, model: nn.Module, every_rank: list[dict[str, Any]]) -> dict[str, Any]:
        inner = getattr(model, "module", model)  # the model inside a DDP wrap
        sums = [rank["weights_sum"] for rank in every_rank if rank["weights_sum"] is not None]
        return {"world_size": len(every_rank), "samples": self.samples, "sampler": self.sampler,
                "device": str(next(model.parameters()).device), "epochs": self.epochs,
                "model_mib": whole_bytes(model.parameters()) / MIB,
                "blocks_mib": [whole_bytes(block.parameters()) / MIB for block in models.blocks(inner)],
                "groups_mib": [count / MIB for count in group_bytes(model)],
                "weights_sums": sums, "ranks": [rank["held"] for rank in every_rank]}


def _rank_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What this rank holds (its shards, where it holds shards) and its weights summed, where it holds them
    whole: the same sum on every rank means the same model."""
    parameters = list(model.parameters())
    held: dict[str, Any] = {f"{kind}_mib": count / MIB for kind, count in held_bytes(model, optimizer).items()}
    device = parameters[0].device
    if device.type == "cuda":
        held["peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB
    whole = not any(isinstance(parameter, DTensor) for parameter in parameters)
    return {"held": held, "weights_sum": sum(p.detach().double().sum().item() for p in parameters) if whole else None}


def read_record(path: str | Path) -> dict[str, Any]:
    """The record a script of the series wrote; a missing file says which cell writes it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not there: run the cell that launches the script (with --out {path})")
    return json.loads(path.read_text())


def steps_losses(record: dict[str, Any]) -> list[float]:
    """Every step's loss of the run, epoch after epoch."""
    return [loss for epoch in record["epochs"] for loss in epoch["losses"]]
