"""Values reduced or gathered over the ranks of a run, and nothing at all with one process (notebooks 06-08,
and every run).

The training loop calls these in every mode, so it reads the same with one process and with many.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum over all ranks (in place); the tensor itself with one process."""
    if active():
        dist.all_reduce(tensor)
    return tensor


def mean_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise mean over all ranks (in place): the loss every rank reports is the same."""
    if active():
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
    return tensor


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on at least one."""
    return max_over_ranks(int(flag), device) > 0


def barrier() -> None:
    """Wait until every rank arrives here (a file one rank wrote is then there for all)."""
    if active():
        dist.barrier()


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest ``value`` of all ranks, on every rank."""
    if not active():
        return value
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order, on every rank."""
    if not active():
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def from_rank_zero(value: Any) -> Any:
    """Rank 0's ``value`` (picklable) on every rank: what only rank 0 computed, every rank returns."""
    if not active():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
