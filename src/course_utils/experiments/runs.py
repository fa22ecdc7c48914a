"""An experiment is a list of named variants of one run (:class:`Variant`: a name and the options that differ),
run one after the other (:func:`run_variants`) and measured alike, by a notebook's cell, where the learner adds
a row and reruns, and by the benchmark that records the same experiment on a GPU node.

Every measured row carries its run's images per second iteration by iteration
(:mod:`course_utils.observe.noise`), which the answers compare; a figure outside what the work allows (above the
ideal, a cost below nothing) is a disturbed measurement, not a finding. Single-process runs happen in this
process; runs on several ranks start torchrun through :mod:`course_utils.parallel.launch` (:func:`run_ranks`), so
a notebook cell shows their output as it comes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from course_utils import config
from course_utils.experiments.machine_shape import RANK_THREADS, cpu_ranks
from course_utils.observe import communication
from course_utils.observe.metrics import load_run
from course_utils.observe.noise import Measurement
from course_utils.observe.profiling import TRACE_FILE
from course_utils.parallel.launch import LaunchResult, launch
from course_utils.run_folder import RunFolder
from course_utils.training.options import to_flags

# Iterations of each throughput measurement of 06-10, by course size. At ci, one epoch of two CPU ranks (1,280 images
# at batch 64 on each): a measurement that ran into a second epoch would time an evaluation and a loader's restart.
MEASURED_STEPS = {"ci": 10, "workshop": 200}
# The runs a lesson makes in its own folders: no progress bar each, and a rerun replaces what the last left.
SCRATCH = {"progress": False, "overwrite": True}


@dataclass(init=False)
class Variant:
    """One named variant of a run: ``Variant("DDP, 64 MB buckets", distributed="ddp", bucket_cap_mb=64)``. Its
    options are the training command's (:class:`~course_utils.training.options.TrainOptions`), or whatever the
    experiment that runs it reads."""

    name: str
    options: dict[str, Any]

    def __init__(self, name: str, **options: Any) -> None:
        self.name, self.options = name, options

    @property
    def folder_name(self) -> str:
        """The name as a folder: lower case, runs of other characters as one '-'."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or "variant"


def _refuse_shared_folders(variants: list[Variant]) -> None:
    """Two variants of one name would be two rows no answer can tell apart; two whose names differ only in case or
    punctuation would share one run folder, the second replacing the first."""
    named: dict[str, str] = {}  # folder name -> the name of the first variant with it
    for variant in variants:
        earlier = named.get(variant.folder_name)
        if earlier == variant.name:
            raise ValueError(f"two variants are named {earlier!r}: give each its own name")
        if earlier is not None:
            raise ValueError(f"the variants {earlier!r} and {variant.name!r} differ only in case or punctuation, so "
                             f"both would run in the folder {variant.folder_name!r}, the second replacing the first: "
                             "rename one with other letters or digits")
        named[variant.folder_name] = variant.name


def run_variants(variants: Iterable[Variant], run: Callable[[Variant], dict[str, Any]], desc: str = "variants",
                 on_row: Callable[[list[dict[str, Any]]], object] | None = None,
                 column: str = "variant") -> pd.DataFrame:
    """Run each variant in order, with a progress bar; one row per variant: its name (in ``column``), then what
    ``run`` measured. Two variants of one name, or of one folder name, are refused before any run. ``on_row`` gets
    the rows so far after each variant (a benchmark records them the moment they exist)."""
    variants = list(variants)
    _refuse_shared_folders(variants)
    rows: list[dict[str, Any]] = []
    for variant in tqdm(variants, desc=desc, unit="run"):
        rows.append({column: variant.name, **run(variant)})
        if on_row is not None:
            on_row(rows)
    return pd.DataFrame(rows)


def refuse_options(variants: Iterable[Variant], why: dict[str, str]) -> None:
    """Refuse, before any run, a variant that sets an option its experiment sets for every run itself; ``why``
    says, for each such option, why it is the experiment's and where to set it instead."""
    for variant in variants:
        taken = [name for name in why if name in variant.options]
        if taken:
            raise ValueError(f"variant {variant.name!r} sets {', '.join(taken)}, which the experiment sets for every "
                             f"run: " + "; ".join(f"{name}: {why[name]}" for name in taken))


def measured_steps(size: str | None = None) -> int:
    """Iterations of each throughput measurement of notebooks 06-10 at ``size`` (the active size by default)."""
    return MEASURED_STEPS[config.get_size(size).name]


def run_ranks(nproc: int, out: Path, echo: bool = False, distributed: str = "ddp", env: dict[str, str] | None = None,
              timeout_seconds: float | None = None, max_restarts: int = 0, **options: Any) -> LaunchResult:
    """``options`` trained with ``distributed`` (DDP by default, or any mode of ``--distributed``) on ``nproc``
    ranks under torchrun, its logs beside ``out``: the one way the course starts the training command on several
    ranks. The launch, with the run's summary and every rank's output, or an error with the end of torchrun's
    output when the job failed. ``env``: variables for the ranks; ``timeout_seconds`` and ``max_restarts``: as
    :func:`course_utils.parallel.launch.launch` takes them."""
    if cpu_ranks(options):  # one rank gets the threads of each of several, as torchrun gives them
        env = {"OMP_NUM_THREADS": str(RANK_THREADS), **(env or {})}
    result = launch(nproc, "course_utils.train", *to_flags(**{**SCRATCH, **options}, distributed=distributed,
                                                           out=out),
                    log_dir=Path(out).parent / f"{Path(out).name}-logs", echo=echo, env=env,
                    timeout_seconds=timeout_seconds, max_restarts=max_restarts)
    if not result.ok:
        tail = "\n".join(result.lines[-15:])
        restarts = f" after {max_restarts} restart(s)" if max_restarts else ""
        raise RuntimeError(f"--distributed {distributed} on {nproc} ranks failed{restarts} (exit "
                           f"{result.returncode}):\n{tail}")
    return result


def traced_ranks(nproc: int, out: Path, **options: Any) -> tuple[pd.DataFrame, LaunchResult]:
    """:func:`run_ranks` with rank 0 traced by the profiler: each traced step's communication and what of it
    hid behind computation (:func:`course_utils.observe.communication.per_step`), and the launch."""
    result = run_ranks(nproc, out, trace=Path(out) / "trace", **options)
    return communication.per_step(Path(out) / "trace" / TRACE_FILE), result


def measured_rate(summary: dict[str, Any]) -> Measurement:
    """A finished run's images per second, iteration by iteration after its warm-up, with their spread; no
    samples (an unknown spread) where its run folder is not at hand (a summary copied from elsewhere)."""
    out = summary.get("config", {}).get("out")
    if not out or not RunFolder(out).metrics.exists():
        return Measurement.of([])
    return load_run(out).steady_rate()
