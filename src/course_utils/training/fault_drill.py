"""A rank that dies on purpose (notebook 12's crash and restart; ``--crash-at-step N``).

The last rank kills itself with SIGKILL once step N is trained and logged, before that step's checkpoint: what
the kernel's out-of-memory killer or a failed node does to a rank, but at a known step, so that the steps a crash
costs are the same on a fast GPU and on a busy CPU (a killer watching from outside acts some steps late, more on
a faster machine). Only the job's first attempt dies: the rank leaves a marker in the run folder before it dies,
and whatever starts the run again (torchrun's restarts, ``--resume auto`` by hand, a Slurm requeue) finds it and
trains on; a new run in the folder, without ``--resume``, removes it and drills again.
"""

from __future__ import annotations

import os
import signal
import sys

from course_utils import atomic_files
from course_utils.parallel.process_group import Placement
from course_utils.run_folder import RunFolder
from course_utils.training.schedule import Plan

# Set by the launcher on every attempt after the first: torchrun's restarts, Slurm's requeues.
RESTART_COUNTERS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


def refuse_unreachable(crash_at_step: int | None, plan: Plan, max_steps: int | None) -> None:
    """A drill step the run never trains would leave the learner waiting for a crash that never comes."""
    if crash_at_step is not None and crash_at_step > plan.total_steps:
        limit = "raise --max-steps" if max_steps is not None and max_steps <= plan.total_steps else "raise --epochs"
        raise ValueError(f"--crash-at-step {crash_at_step} is past the run's last step ({plan.total_steps}): "
                         f"choose a step the run trains, or {limit}")


def first_attempt(folder: RunFolder) -> bool:
    """No launcher counts a restart, and no earlier attempt of this run left the drill's marker."""
    restarted = any(os.environ.get(counter, "0") not in ("", "0") for counter in RESTART_COUNTERS)
    return not restarted and not folder.crash_drill_done.exists()


def crash_if_due(crash_at_step: int | None, step: int, where: Placement, folder: RunFolder) -> None:
    """Kill this process with SIGKILL when it is the last rank, ``step`` is the drill's and this is the first
    attempt; the marker is written and the output so far flushed first, as a real crash would not, so that a
    restart trains on and the log reads cleanly."""
    if step != crash_at_step or where.rank != where.world_size - 1 or not first_attempt(folder):
        return
    atomic_files.write_text_atomic(folder.crash_drill_done,
                                   f"the crash drill killed rank {where.rank} after step {step}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
