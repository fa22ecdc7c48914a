"""A rank that dies on purpose (notebook 12's crash and restart; ``--crash-at-step N``).

The last rank kills itself with SIGKILL once step N is trained and logged, before that step's checkpoint: what
the kernel's out-of-memory killer or a failed node does to a rank, but at a known step, so that the steps a crash
costs are the same on a fast GPU and on a busy CPU (a killer watching from outside acts some steps late, more on
a faster machine). Only the job's first attempt dies: torchrun's restarts (``TORCHELASTIC_RESTART_COUNT``) run on.
"""

from __future__ import annotations

import os
import signal
import sys

from course_utils.parallel.process_group import Placement
from course_utils.training.schedule import Plan


def refuse_unreachable(crash_at_step: int | None, plan: Plan) -> None:
    """A drill step the run never trains would leave the learner waiting for a crash that never comes."""
    if crash_at_step is not None and crash_at_step > plan.total_steps:
        raise ValueError(f"--crash-at-step {crash_at_step} is past the run's last step ({plan.total_steps}): "
                         "choose a step the run trains, or raise --epochs")


def crash_if_due(crash_at_step: int | None, step: int, where: Placement) -> None:
    """Kill this process with SIGKILL when it is the last rank, ``step`` is the drill's and this is the first
    attempt; its output so far is flushed first, as a real crash would not, so that its log reads cleanly."""
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if step == crash_at_step and where.rank == where.world_size - 1 and first_attempt:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
