"""FSDP2: every rank holds a shard of the model, its gradients and its optimizer state (notebook 09).

``fully_shard`` on each block and then on the root turns every parameter into a DTensor of which
this rank keeps 1/N. Before a block's forward (and again before its backward) its parameters are
all-gathered into whole tensors and freed again afterwards; after the backward its gradients are
reduce-scattered, so each rank receives only the gradients of its own shard, and the optimizer
updates only that shard. This is ZeRO stage 3: memory per rank falls with the number of ranks,
at the price of an all-gather per block in each forward and backward.

Mixed precision follows ``--amp``: parameters are gathered and computed in the low-precision
dtype, gradients reduced in fp32, BatchNorm kept in fp32 (its running statistics stay fp32, and
its parameters with them). ``offload`` keeps the shards and the optimizer state in host memory
and copies them to the GPU when needed: the largest models fit, each step pays for the copies.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard


def precision_policy(amp_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """Parameters gathered in ``amp_dtype`` (fp32 without ``--amp``), gradients reduced in fp32."""
    return MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)


def _norm_policy(amp_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """BatchNorm computed in fp32 on fp32 inputs, its output handed back in ``amp_dtype``."""
    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=amp_dtype)


def ranks_mesh(device: torch.device) -> DeviceMesh:
    """Every rank of the process group in one row, on the devices the run trains on.

    Without a mesh, ``fully_shard`` builds one on the machine's accelerator: CPU ranks on a GPU machine (the
    one-GPU shape of notebook 09) then each claim GPU ``LOCAL_RANK``, and rank 1 fails with "invalid device
    ordinal" where there is one GPU.
    """
    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard(model: nn.Module, blocks: list[nn.Module], amp_dtype: torch.dtype | None, offload: bool,
          device: torch.device, mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard ``model`` over the process group's ranks on ``device`` (or over ``mesh``, the data-parallel
    dimension of a 2-D mesh): each of ``blocks``, then the root (which keeps what no block holds: the stem and
    the head). The module is changed in place and returned."""
    offload_policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    mesh = ranks_mesh(device) if mesh is None else mesh
    if amp_dtype is not None:
        for norm in model.modules():
            if isinstance(norm, nn.modules.batchnorm._BatchNorm):
                fully_shard(norm, mesh=mesh, mp_policy=_norm_policy(amp_dtype), offload_policy=offload_policy)
    policy = precision_policy(amp_dtype)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, offload_policy=offload_policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=offload_policy)
    return model


def whole_bytes(parameters: Iterable[torch.Tensor]) -> int:
    """The bytes of ``parameters`` whole: every rank's shards together."""
    return sum(parameter.numel() * parameter.element_size() for parameter in parameters)


def group_bytes(model: nn.Module) -> list[int]:
    """The whole size of each FSDP group of ``model``: its own parameters, not those of a group below it. A rank
    gathers a group whole while the group runs, so the largest sets the peak that sharding leaves."""
    groups = [module for module in model.modules() if isinstance(module, FSDPModule)]
    sizes = []
    for group in groups:
        below = {id(p) for sub in group.modules() if sub is not group and is_sharded(sub) for p in sub.parameters()}
        sizes.append(whole_bytes(p for p in group.parameters() if id(p) not in below))
    return sizes


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` is sharded by FSDP2: its forward is a collective every rank must join."""
    return isinstance(model, FSDPModule)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: the local shard of a DTensor, a plain tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor
