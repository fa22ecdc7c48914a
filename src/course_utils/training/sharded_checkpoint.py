"""Sharded checkpoints of FSDP runs: each rank writes and reads only its own shards (notebook 09).

``torch.distributed.checkpoint`` (DCP) saves the model's and the optimizer's sharded state dicts
in parallel, one file per rank, and a ``.metadata`` file that says which piece of which tensor is
where. Because of that map, a checkpoint written by N ranks loads into M ranks: each reads the
pieces its new shards need (resharding). The rest of the run's state (schedule, position, random
generators, configuration) is small and goes into ``extra.pt``, written by rank 0.

The folder is written under a temporary name and renamed into place by rank 0 once every rank's
shards, the metadata and ``extra.pt`` are written: a run killed mid-write leaves the previous
checkpoint as the newest whole one.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from course_utils.atomic_files import replace_directory
from course_utils.parallel.collectives import barrier
from course_utils.training import checkpoint


def save_keeping(model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, Any], folder: Path,
                 step: int, keep: int, is_main: bool) -> Path:
    """Every rank writes its shards of ``step``'s checkpoint (call on all ranks); rank 0 adds ``extra``,
    moves the folder into place and deletes all but the newest ``keep`` checkpoints."""
    final = checkpoint.step_path(folder, step, sharded=True)
    partial = final.with_name(f".{final.name}.tmp")
    if is_main:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=partial)
    if is_main:
        checkpoint.save_atomic(extra, partial / checkpoint.SHARDED_EXTRA)
        replace_directory(partial, final)  # the same step saved again replaces the older folder
        checkpoint.remove_oldest(folder, keep)
    barrier()
    return final


def load_model_and_optimizer(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read this rank's shards of ``path`` into the sharded ``model`` and ``optimizer`` (call on all ranks),
    whatever the number of ranks that wrote them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.load(state, checkpoint_id=path)
    except dcp.CheckpointException as error:
        raise checkpoint.DamagedCheckpoint(f"{path}: its shards do not load ({error}); resume from an older "
                                           "checkpoint with --resume PATH, or start a new run") from error
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
