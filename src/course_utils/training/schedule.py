"""How long a run is and how its learning rate moves: steps per epoch, steps in all, warm-up and cosine
(notebooks 01, 07-08).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from course_utils.training.setup import Setup


@dataclass(frozen=True)
class Plan:
    """The optimizer steps of a run: per epoch, in all (``--max-steps`` may end it mid-epoch), how
    many epochs that touches, and the steps of ``--epochs``, over which the learning rate moves.

    ``--max-steps`` stops a run early without changing its schedule: a run continued with a higher
    ``--max-steps`` trains exactly as one that was never stopped.
    """

    steps_per_epoch: int
    total_steps: int
    epochs: int
    scheduled_steps: int

    @classmethod
    def of(cls, setup: Setup) -> Plan:
        cfg = setup.cfg
        steps_per_epoch = len(setup.loaders.train) // cfg.grad_accum
        if steps_per_epoch == 0:
            raise ValueError(f"--grad-accum {cfg.grad_accum} needs more batches than one epoch has "
                             f"({len(setup.loaders.train)}); lower it or use more samples")
        total = steps_per_epoch * cfg.epochs
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        return cls(steps_per_epoch, total, math.ceil(total / steps_per_epoch), steps_per_epoch * cfg.epochs)


def lr_schedule(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """The factor on the peak learning rate at each step: a linear warm-up over ``warmup_steps``
    (large global batches diverge without one), then a cosine down to zero."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


def scheduler(setup: Setup, plan: Plan) -> torch.optim.lr_scheduler.LambdaLR:
    """The run's learning-rate scheduler: ``--warmup-steps`` (or ``--warmup-epochs``) of warm-up, then the cosine."""
    warmup = setup.cfg.warmup_steps or round(setup.cfg.warmup_epochs * plan.steps_per_epoch)
    return torch.optim.lr_scheduler.LambdaLR(setup.optimizer, lr_schedule(plan.scheduled_steps, warmup))
