"""Notebook 09's experiment and the memory-ladder benchmark: the ladder's rungs (notebook 09's cell: one process, DDP,
FSDP, FSDP with activation checkpointing, FSDP with offload), each trained for real and its memory per rank measured
by kind. Every rung trains the same model at the same per-rank batch for the same steps, on the devices
:func:`course_utils.experiments.machine_shape.parallel_shape` picks: one GPU per rank where there are two or more,
CPU processes talking through gloo elsewhere (never two NCCL ranks on one GPU). Offload needs GPUs: on CPU processes
its rung is left out and the table says so."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from course_utils import config
from course_utils.experiments.designs import notebook_design
from course_utils.experiments.machine_shape import cpu_ranks, parallel_shape, threads_of_a_rank
from course_utils.experiments.runs import SCRATCH, Variant, measured_rate, measured_steps, run_ranks, run_variants
from course_utils.observe.memory import KINDS
from course_utils.parallel.layout import mode_of
from course_utils.train import train

MIB = 2**20


def notebook_rungs() -> tuple[Variant, ...]:
    """The ladder's rungs as notebook 09's cell ships them (each a Variant: its name, and the training options that
    differ, ``distributed`` at least): the one design, which the benchmark climbs."""
    return tuple(notebook_design("09_sharding_and_memory.ipynb", "rungs", {"Variant": Variant}))


# On one GPU (world size 1, nothing to shard over): what one device holds by kind, with and without checkpointing.
ONE_GPU_LADDER = (
    Variant("one process", distributed="none"),
    Variant("one process + activation checkpointing", distributed="none", activation_checkpointing=True),
)


def needs_gpus(rung: Variant) -> bool:
    """Offloading moves FSDP's shards between a GPU and host memory: on CPU ranks there is nothing to move."""
    return bool(rung.options.get("offload"))


def how(rung: Variant) -> str:
    return rung.options.get("distributed", "none")


def _row(rung: Variant, summary: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's memory by kind (in MiB) and the run's speed; the ranks hold the same amounts, within padding."""
    memory = summary["per_rank"][0]["step_memory_bytes"]
    row = {"distributed": how(rung), "ranks": summary["world_size"],
           "device": summary["device"],
           **{f"{kind}_mib": (memory[kind] or 0) / MIB for kind in KINDS}}
    row["total_mib"] = sum(row[f"{kind}_mib"] for kind in KINDS)
    row["peak_allocated_mib"] = memory["peak_allocated"] / MIB if memory["peak_allocated"] else None
    row["images_per_second"] = summary["images_per_second"]
    row["measured"] = measured_rate(summary)  # iteration by iteration, for the answer's verdicts
    row["parameters"] = summary["parameters"]
    return row


def climb(rungs: Sequence[Variant] | None = None, steps: int | None = None, out: str | Path | None = None,
          one_gpu: bool = False, **options: Any) -> pd.DataFrame:
    """Train every rung that runs here; one row per rung: memory per rank by kind, images per second.
    ``one_gpu``: the rungs of :data:`ONE_GPU_LADDER` on this process's GPU, world size 1 (a node with one GPU,
    where the ladder's ranks would be CPU processes)."""
    size = config.get_size(options.get("size"))
    shape = parallel_shape()
    out = Path(out or config.runs_dir() / "memory-ladder")
    rungs = ONE_GPU_LADDER if one_gpu else rungs or notebook_rungs()
    device = "auto" if one_gpu else shape.device  # one process, no ranks: on the GPU
    common = {"max_steps": steps or measured_steps(size.name), "device": device, **SCRATCH, **options}

    def run(rung: Variant) -> dict[str, Any]:
        if needs_gpus(rung) and not shape.on_gpus:
            return {"distributed": how(rung), "skipped": "it needs GPUs; the ranks here are CPU processes"}
        folder = out / rung.folder_name
        if not mode_of(how(rung)).one_process_per_device:
            with threads_of_a_rank(cpu_ranks(common)):  # like against like beside the CPU ranks
                return _row(rung, train(**common, **rung.options, out=folder))
        return _row(rung, run_ranks(shape.ranks, folder, **common, **rung.options).summary)

    return run_variants(rungs, run, desc="rungs", column="rung")
