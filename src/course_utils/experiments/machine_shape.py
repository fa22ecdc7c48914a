"""Where the parallel lessons' ranks run on this machine, and the one rule that follows from it (notebooks 06-12,
their benchmarks): with two or more GPUs, one rank per GPU at the active course size; with fewer, the ranks are CPU
processes talking through gloo, one thread each, and they run the ``ci`` size, since the workshop size's models
and data are GPU work (hours on CPU processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from course_utils import config, devices

CPU_RANKS = 2  # DDP ranks on a machine without GPUs
RANK_THREADS = 1  # threads of each CPU rank: torchrun's own OMP_NUM_THREADS for several ranks, set for one too


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_ranks(options: dict[str, Any]) -> bool:
    """Whether runs with these training options compute on CPU processes (``device="cpu"``, or no GPU)."""
    return options.get("device") == "cpu" or gpu_count() == 0


@contextmanager
def threads_of_a_rank(on_cpu: bool) -> Iterator[None]:
    """One process set beside CPU ranks computes with the threads of one rank, so that the comparison is of
    like against like: PyTorch's default would give it every core while each rank gets one."""
    if not on_cpu:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(RANK_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class ParallelShape:
    """How the parallel lessons run on this machine, and what they cannot show here.

    NCCL and RCCL take one GPU per rank (two ranks on one GPU fail with "Duplicate GPU detected"),
    so with fewer than two GPUs the ranks are CPU processes that talk through gloo: they show what
    DDP does (the same parameters as one large batch, the sampler's shares, the knobs), not how fast
    GPUs do it.
    """

    gpus: int
    ranks: int
    device: str  # the training command's --device for every run of a lesson: "auto" (one GPU per rank) or "cpu"

    @property
    def on_gpus(self) -> bool:
        return self.device != "cpu"

    @property
    def script_device(self) -> str:
        """The device a lesson's own scripts take: "cuda" (ROCm's GPUs answer to it too) or "cpu"."""
        return "cuda" if self.on_gpus else "cpu"

    @property
    def rank_device(self) -> torch.device:
        """The device rank 0 trains on (what tables and records name)."""
        return devices.default_device() if self.on_gpus else torch.device("cpu")

    @property
    def size(self) -> config.Size:
        """The course size the lessons run: the active one on GPUs; ``ci`` on CPU ranks."""
        return config.get_size() if self.on_gpus else config.get_size("ci")

    def rows_label(self) -> str:
        """What a benchmark's rows say about where their ranks ran: a CPU figure from a GPU node is not a GPU
        figure, and says so."""
        if self.on_gpus:
            return f"{self.ranks} GPUs, one rank each"
        here = "a node with one GPU" if self.gpus == 1 else "a machine without GPUs"
        return f"CPU processes (gloo) on {here}: CPU figures, not GPU figures"

    def describe(self) -> str:
        """Where the ranks run, and what to ask for to see more; on CPU ranks at another active size, that this
        notebook runs the ci size."""
        if self.on_gpus:
            return f"{self.ranks} ranks, one per GPU, talking through NCCL/RCCL"
        here = "one GPU here" if self.gpus == 1 else "no GPU here"
        active = config.get_size().name
        smaller = (f" The ranks are CPU processes, so this notebook runs the ci size (tiny data, small models) "
                   f"instead of {active}, and says so." if active != "ci" else "")
        return (f"{here}: the {self.ranks} ranks are CPU processes talking through gloo, one thread each (and one "
                "process set beside them gets one thread too). They show the mechanics, the memory each rank holds "
                "and the bytes the ranks move, not GPU speed-ups or GPU communication; for those, ask for 2 or more "
                "GPUs (on LUMI, the Jupyter app or an sbatch with --gpus-per-node=2 or more, up to 8 GCDs per node)."
                + smaller)


def parallel_shape(gpus: int | None = None) -> ParallelShape:
    """The :class:`ParallelShape` of this machine (or of one with ``gpus`` GPUs)."""
    gpus = gpu_count() if gpus is None else gpus
    return ParallelShape(gpus, gpus, "auto") if gpus >= 2 else ParallelShape(gpus, CPU_RANKS, "cpu")
