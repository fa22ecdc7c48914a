"""Activation checkpointing: keep only each block's input for the backward pass and run the block's
forward again when its gradients are needed (notebook 09, ``--activation-checkpointing``).

The memory of the activations that autograd saves inside a block is traded for a second forward
of that block in the backward pass: about a third more compute for the model's blocks.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_blocks(blocks: list[nn.Module]) -> list[nn.Module]:
    """Make each of ``blocks`` recompute its forward in the backward pass instead of saving its
    activations. The blocks keep their parameters' names: checkpoints are unchanged."""
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return blocks
