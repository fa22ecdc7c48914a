"""Activation checkpointing: keep only each block's input for the backward pass and run the block's
forward again when its gradients are needed (notebook 09, ``--activation-checkpointing``).

The memory of the activations that autograd saves inside a block is traded for a second forward
of that block in the backward pass: about a third more compute for the model's blocks. That second
forward must not count the batch twice in a BatchNorm's running statistics: while it runs, each
BatchNorm of the block keeps its statistics (momentum 0) and its batch count. A compiled model needs no
such care: its recomputation leaves buffers alone (and ``torch.compile`` takes no other contexts).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def statistics_kept(block: nn.Module) -> Iterator[None]:
    """Run ``block`` without changing its BatchNorms' running statistics or batch counts."""
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = [(norm.momentum, norm.num_batches_tracked.clone()) for norm in norms]
    for norm in norms:
        norm.momentum = 0.0  # the running average takes none of this batch
    try:
        yield
    finally:
        for norm, (momentum, count) in zip(norms, saved):
            norm.momentum = momentum
            norm.num_batches_tracked.copy_(count)


def _contexts(block: nn.Module) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """What ``checkpoint`` runs the first forward in, and what it runs the recomputation in."""
    return contextlib.nullcontext(), statistics_kept(block)


def _checkpointed(block: nn.Module, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if torch.compiler.is_compiling():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=functools.partial(_contexts, block), **kwargs)


def checkpoint_blocks(blocks: list[nn.Module]) -> list[nn.Module]:
    """Make each of ``blocks`` recompute its forward in the backward pass instead of saving its
    activations. The blocks keep their parameters' names: checkpoints are unchanged."""
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block, block.forward)
    return blocks
