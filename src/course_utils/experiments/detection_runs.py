"""Notebook 10's runs and the detection benchmark: the detector trained with the one training command (--data coco) as
the cluster team's study asked: strong scaling at a fixed global batch, a traced DDP run with NCCL's own report, and
AMP against fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from course_utils import config
from course_utils.data import coco, generated_coco
from course_utils.doctor import transport
from course_utils.experiments import scaling_studies
from course_utils.experiments.machine_shape import parallel_shape
from course_utils.experiments.runs import SCRATCH, Variant, measured_rate, measured_steps, run_variants, traced_ranks
from course_utils.train import train
from course_utils.training.detection_models import DETECTION_RECIPES
from course_utils.training.resume import NonFiniteLossError

# Detectron2's 1x recipe: lr 0.02 for a global batch of 16 images, raised linearly over the first 1,000 iterations.
REFERENCE_BATCH, REFERENCE_WARMUP = 16, 1000


STAND_IN = (512, 64)  # training and validation images of the COCO-format stand-in at photo sizes


def workshop_recipe(global_batch: int, steps: int) -> dict[str, Any]:
    """The R50-FPN's learning rate scaled to ``global_batch`` (the linear rule Detectron2 follows: 0.02 is for
    16 images, so one GPU with 2 takes 0.0025) and a linear warm-up over Detectron2's 1,000 iterations, or the
    first fifth of a shorter run: a detector trained from scratch at 8x its rate and no warm-up diverges."""
    rate = DETECTION_RECIPES["workshop"].lr * global_batch / REFERENCE_BATCH
    return {"lr": rate, "warmup_steps": max(1, min(REFERENCE_WARMUP, steps // 5))}


def detection_data(size: str) -> tuple[Path, str]:
    """Where the detector's data is at ``size``, and a sentence that says what it is: COCO 2017 where it is
    prepared; at the workshop size without it (19 GB that a one-GCD attendee rarely has), the COCO-format
    stand-in at photo sizes, generated here the first time (seconds): its seconds per iteration compare, its box
    AP says nothing about COCO."""
    root = config.data_dir(config.get_size(size), "coco")
    if size != "workshop" or not _absent(root):  # what is there is checked whole by the run that reads it
        return root, coco.describe(root)
    stand_in = root.parent / "coco-stand-in"
    if _absent(stand_in):
        generated_coco.generate(stand_in, *STAND_IN, photo_sizes=True)
    return stand_in, (f"COCO 2017 is not prepared in {root} (about 19 GB: python -m data_prep --size workshop "
                      f"--coco); these runs use {coco.describe(stand_in)} instead, at COCO's photo sizes: their "
                      "seconds per iteration compare with COCO's, their box AP says nothing about it")


def _absent(root: Path) -> list[str]:
    """What of a COCO-format tree is not there at all (a split's images or annotations): cheap, where reading
    COCO's 448 MB of training annotations to check them would take a minute."""
    return [name for split in coco.SPLITS for name in coco.missing(root, split)]


def _options(options: dict[str, Any], global_batch: int | None = None) -> dict[str, Any]:
    """The training options of the lesson's runs: COCO-format data (the stand-in where COCO is missing), and at
    the workshop size the recipe scaled to ``global_batch`` (the recipe's batch on one process by default)."""
    shape, size = parallel_shape(), config.get_size(options.get("size")).name
    steps = options.get("max_steps") or measured_steps(size)
    defaults = {"data": "coco", "device": shape.device, "max_steps": steps, "data_dir": detection_data(size)[0],
                **SCRATCH}
    if size == "workshop" and "lr" not in options:
        defaults.update(workshop_recipe(global_batch or DETECTION_RECIPES[size].batch_size, steps))
    return {**defaults, **options}


def fixed_global_batch(ranks: list[int] | None = None, global_batch: int | None = None,
                       out: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """Strong scaling as the team ran it: the same global batch split over 1, 2, ... ranks; seconds per
    iteration, wall time, speed-up, efficiency and box AP of each run (monitored)."""
    size, shape = config.get_size(options.get("size")), parallel_shape()
    ranks = ranks or [count for count in scaling_studies.scaling_ranks(size.name) if count <= shape.ranks]
    global_batch = global_batch or DETECTION_RECIPES[size.name].batch_size * max(ranks)
    return scaling_studies.study(ranks, "strong", out=out or config.runs_dir() / "detection-scaling",
                         batch_size=global_batch, monitor="auto", **_options(options, global_batch))


def communication_and_transport(ranks: int | None = None, out: str | Path | None = None,
                                **options: Any) -> tuple[pd.DataFrame, transport.Transport]:
    """One traced DDP run of the detector with ``NCCL_DEBUG=INFO``: each step's communication and what of
    it hid behind computation (rank 0's trace), and which transport NCCL chose (none under gloo)."""
    folder = Path(out or config.runs_dir() / "detection-profile")
    ranks = ranks or parallel_shape().ranks
    recipe = DETECTION_RECIPES[config.get_size(options.get("size")).name]
    steps, result = traced_ranks(ranks, folder, env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"},
                                 **_options(options, recipe.batch_size * ranks))
    return steps, transport.read(result.lines)  # NCCL's report


def amp_effect(precisions: tuple[str, ...] = ("off", "bf16"), out: str | Path | None = None,
               **options: Any) -> pd.DataFrame:
    """The same short run in fp32 and with autocast: seconds per iteration and box AP of each, one process. A run
    whose loss stops being finite is a row that says so, not a failed cell."""
    out = Path(out or config.runs_dir() / "detection-amp")

    def run(precision: Variant) -> dict[str, Any]:
        try:
            summary = train(**_options({"device": "auto", **options}), **precision.options,
                            out=out / precision.folder_name)
        except NonFiniteLossError as error:
            return {"status": f"diverged: {error}".split(";")[0]}
        return {"status": "ok", "seconds_per_iteration": summary["seconds_per_iteration"],
                "images_per_second": summary["images_per_second"], "box_ap": summary["box_ap"],
                "device": summary["device"], "measured": measured_rate(summary)}

    table = run_variants([Variant(amp, amp=amp) for amp in precisions], run, desc="precisions", column="amp")
    if "seconds_per_iteration" in table:
        table["speedup"] = table["seconds_per_iteration"].iloc[0] / table["seconds_per_iteration"]
    return table
