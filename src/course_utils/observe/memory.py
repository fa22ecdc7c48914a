"""The memory of one training step, by kind, counted from the tensors this rank holds (notebooks 09 and 12).

Parameters, gradients and optimizer state are what stays between steps: under FSDP each rank
holds only its shards, and only those are counted. Activations are what autograd saves in the
forward pass for the backward pass, counted as it saves them (``saved_tensors_hooks``); under
activation checkpointing a recomputed block saves only its input. On a GPU the allocator's peak
during the step adds what the others leave out: temporaries, gathered FSDP parameters, buffers
of the communication, the allocator's own rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import torch
from torch import nn

from course_utils.parallel.sharding import local_tensor

KINDS = ("parameters", "gradients", "optimizer_state", "activations")


@dataclass(frozen=True)
class StepMemory:
    """Bytes this rank holds for one training step, by kind; ``peak_allocated`` on GPUs only."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int | None  # None where not measurable (a compiled model saves inside its graph)
    peak_allocated: int | None

    def as_dict(self) -> dict[str, int | None]:
        return asdict(self)


def _storage_key(storage: torch.UntypedStorage) -> int:
    """What tells storages apart: their address; on the meta device, where none has one (a forecast of the memory
    without the memory, notebook 12), the storage's own object, which views share."""
    return storage._cdata if storage.device.type == "meta" else storage.data_ptr()


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages behind ``tensors`` (views of one storage count once)."""
    storages = {}
    for tensor in tensors:
        storage = local_tensor(tensor).untyped_storage()
        storages[_storage_key(storage)] = storage.nbytes()
    return sum(storages.values())


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters, gradients and optimizer state that this rank holds now (its local shards)."""
    parameters = list(model.parameters())
    state = [value for values in optimizer.state.values() for value in values.values()
             if isinstance(value, torch.Tensor) and value.dim() > 0]  # not the step counters
    return {"parameters": _storage_bytes(parameters),
            "gradients": _storage_bytes(p.grad for p in parameters if p.grad is not None),
            "optimizer_state": _storage_bytes(state)}


class SavedActivations:
    """Counts the bytes autograd saves for the backward pass while it is entered, per forward pass of ``model``
    (each micro-batch's are freed by its backward pass before the next one's are saved): the largest count.

    Parameters and their views are left out (they are counted as parameters; FSDP's gathered copies are
    freed and gathered again). For each block in ``recomputed`` the input is counted instead of its insides.
    """

    def __init__(self, model: nn.Module, recomputed: list[nn.Module] = ()) -> None:
        self.model, self.recomputed = model, recomputed
        self._forwards: list[dict[int, int]] = []  # per forward pass: storage address -> bytes
        self._exits = contextlib.ExitStack()

    @property
    def bytes(self) -> int:
        return max((sum(storages.values()) for storages in self._forwards), default=0)

    def _keep(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, nn.Parameter) and not isinstance(tensor._base, nn.Parameter):  # a weight's .t()
            storage = local_tensor(tensor).untyped_storage()  # tensor parallelism saves DTensors
            self._forwards[-1][_storage_key(storage)] = storage.nbytes()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._forwards:
            self._keep(tensor)
        return tensor

    def _forward_starts(self, module: nn.Module, inputs: tuple) -> None:
        self._forwards.append({})

    def _block_input(self, module: nn.Module, inputs: tuple) -> None:
        for value in inputs:
            if isinstance(value, torch.Tensor):
                self._keep(value)

    def __enter__(self) -> SavedActivations:
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._exits.enter_context(hooks)
        self._exits.callback(self.model.register_forward_pre_hook(self._forward_starts).remove)
        for block in self.recomputed:
            self._exits.callback(block.register_forward_pre_hook(self._block_input).remove)
        return self

    def __exit__(self, *exc: object) -> None:
        self._exits.close()


@contextlib.contextmanager
def measure_step(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 recomputed: list[nn.Module] = (), activations: bool = True) -> Iterator[list[StepMemory]]:
    """Measure the training step run inside: yields a list that holds its :class:`StepMemory` once
    the step is done (the state after the optimizer step, the activations of its largest micro-batch)."""
    result: list[StepMemory] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with SavedActivations(model, recomputed) if activations else contextlib.nullcontext() as saved:
        yield result
    held = held_bytes(model, optimizer)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    result.append(StepMemory(**held, activations=saved.bytes if saved else None,
                             peak_allocated=peak))
