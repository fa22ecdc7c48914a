"""Tensor parallelism: each layer of a vision transformer's blocks split over the ranks of a device mesh
(notebook 11; ``--distributed tp`` and ``--distributed fsdp-tp``).

Megatron-LM's split, written as DTensor plans for ``parallelize_module``: in every block the attention's
query, key and value projections and the MLP's first layer are split column-wise (each rank computes
1/N of the heads, 1/N of the hidden units), the attention's output projection and the MLP's second
layer row-wise (each rank's partial sums are added over the ranks). Between the blocks the tokens are
split along the sequence (sequence parallelism): the LayerNorms and the residual additions each work on
1/N of the tokens, and where a plain column-wise split all-reduces, the row-wise layers reduce-scatter
instead and the column-wise ones all-gather: the same volume of communication, 1/N of the activations.

``fsdp-tp`` puts the ranks on a 2-D mesh, ``data`` x ``tensor``: the ranks of a row of ``tensor`` split
each layer, the rows are FSDP's data-parallel shards of one another (torchtitan's layout). Each row
reads its own share of the global batch; the ranks within a row read the same images. The mesh and the
number of ranks in a row come from the run's :class:`~course_utils.parallel.layout.Layout`.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def block_plan() -> dict[str, ParallelStyle]:
    """The split of one transformer block (:class:`~course_utils.training.vision_transformer.Block`), whose
    input and output are this rank's share of the tokens."""
    gather_tokens = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        "attention_norm": SequenceParallel(),
        "attention": gather_tokens,
        "attention.query": ColwiseParallel(),
        "attention.key": ColwiseParallel(),
        "attention.value": ColwiseParallel(),
        "attention.out": RowwiseParallel(output_layouts=Shard(1)),
        "mlp_norm": SequenceParallel(),
        "mlp": gather_tokens,
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }


def model_plan() -> dict[str, ParallelStyle]:
    """Around the blocks: the patch embedding's tokens (the same on every rank) cut along the sequence, and
    gathered whole again for the head. Embedding and head are not split: every rank computes them."""
    return {
        "embed": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)),
        "head": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                   use_local_output=True),
    }


def parallelize(model: nn.Module, blocks: list[nn.Module], tensor_mesh: DeviceMesh) -> nn.Module:
    """Split ``model``'s ``blocks`` over ``tensor_mesh`` in place (their weights become DTensors)."""
    for block in blocks:
        parallelize_module(block, tensor_mesh, block_plan())
        for norm in (block.attention_norm, block.mlp_norm):
            for weight in norm.parameters():
                weight.register_hook(_summed_over_ranks)
    return parallelize_module(model, tensor_mesh, model_plan())


def _summed_over_ranks(gradient: DTensor) -> DTensor:
    """A sequence-parallel norm's gradient, whole on every rank. Each rank's LayerNorm saw 1/N of the tokens, so
    its weight's gradient is a partial sum (a ``Partial`` DTensor): the sum over the ranks (an all-reduce) is
    the gradient of the whole sequence, which the optimizer and the checkpoint need."""
    return gradient.redistribute(placements=[Replicate()] * gradient.device_mesh.ndim)


def misfits(model: nn.Module, tp_size: int) -> list[str]:
    """Why the vision transformer ``model`` cannot be split over ``tp_size`` ranks (sizes that do not divide);
    empty when it can."""
    shape = model.shape
    sizes = {"attention heads": shape.heads, "tokens (image patches)": model.tokens,
             "MLP hidden units": shape.dim * shape.mlp_ratio}
    return [f"{tp_size} tensor-parallel ranks cannot split {count} {what} evenly: use a number of ranks (with "
            f"--distributed tp) or a --tp-size (with fsdp-tp) that divides it"
            for what, count in sizes.items() if count % tp_size]
