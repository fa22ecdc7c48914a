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

import errno
import os
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
from course_utils.training.shard_files import DataOnlyPlanner, DataOnlyReader, NotData

SHORT_WRITE = "unexpected pos"  # PyTorch's zip writer (inline_container.cc) when a file took fewer bytes than sent


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
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=partial)
    except dcp.CheckpointException as error:  # a BaseException: the command's one-line errors would miss it
        raise _as_error(error, partial) from None
    if is_main:
        checkpoint.save_atomic(extra, partial / checkpoint.SHARDED_EXTRA)
        replace_directory(partial, final)  # the same step saved again replaces the older folder
        checkpoint.remove_oldest(folder, final, keep)
    barrier()
    return final


def load_model_and_optimizer(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read this rank's shards of ``path`` into the sharded ``model`` and ``optimizer`` (call on all ranks),
    whatever the number of ranks that wrote them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.load(state, storage_reader=DataOnlyReader(path), planner=DataOnlyPlanner())
    except dcp.CheckpointException as error:
        raise checkpoint.DamagedCheckpoint(f"{path}: its shards do not load ({_first_failure(error)}); resume "
                                           "from an older checkpoint with --resume PATH, or start a new run") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _first_cause(error: dcp.CheckpointException) -> BaseException | None:
    """The first failing rank's own exception, where DCP's gathers every rank's with its traceback."""
    for failure in error.failures.values():
        return failure[0] if isinstance(failure, tuple) else failure
    return None


def _first_failure(error: dcp.CheckpointException) -> str:
    """One line for the first rank's failure, instead of DCP's traceback of every rank."""
    cause = _first_cause(error)
    if cause is None:
        return "no rank said why"
    return str(cause) if isinstance(cause, NotData) else f"{type(cause).__name__}: {cause}"


def _as_error(error: dcp.CheckpointException, folder: Path) -> Exception:
    """A failed save as the error it was on the first failing rank (a full disk: ``OSError`` ENOSPC, naming the
    folder), which the training command reports in one line.

    A full disk reaches DCP in two ways: Python's own write raises ENOSPC, or PyTorch's zip writer (an item saved
    with ``torch.save``) finds its file shorter than it wrote and says only "unexpected pos": a short write,
    which on a local disk is a full one."""
    cause = _first_cause(error)
    if isinstance(cause, OSError):
        return OSError(cause.errno, cause.strerror, cause.filename or str(folder))
    if isinstance(cause, RuntimeError) and SHORT_WRITE in str(cause):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))
    return RuntimeError(f"the sharded checkpoint in {folder} was not written: {_first_failure(error)}")
