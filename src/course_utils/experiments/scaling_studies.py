"""Notebook 08's experiments, notebook 10's strong scaling and the scaling benchmark: strong and weak scaling
(the same training at 1..N ranks, with speed-up and efficiency) and the large-batch learning rate.

Strong scaling keeps the global batch and splits it over more ranks (each does less work per
step); weak scaling keeps the batch per rank (the global batch grows with the ranks). Ideal is a
speed-up equal to the rank count; efficiency is the measured speed-up divided by it.

    python -m course_utils.experiments.scaling_studies --ranks 1 2 4 8 --mode weak -- --model resnet50
    python -m course_utils.experiments.scaling_studies --collect runs/slurm/1234 runs/slurm/1240   # 1, 2, ... nodes

The first form starts torchrun on this machine for each rank count; the second reads the
``summary.json`` of runs made elsewhere, e.g. the same job script submitted with ``--nodes`` 1, 2, 4.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from course_utils import config
from course_utils.atomic_files import write_text_atomic
from course_utils.experiments.runs import SCRATCH, Variant, measured_rate, run_ranks, run_variants
from course_utils.run_folder import RunFolder
from course_utils.train import train
from course_utils.training.options import changed_options
from course_utils.training.resume import NonFiniteLossError

STUDIES = ("strong", "weak")


SCALING_RANKS = {"ci": (1, 2), "workshop": (1, 2, 4, 8)}  # process counts of a study (capped by the devices)


# Each case of the learning-rate study: its epochs and training images (None: the size's own).
LR_STUDY = {"ci": {"epochs": 1, "train_samples": 1280}, "workshop": {"epochs": 5, "train_samples": None}}


def scaling_ranks(size: str | None = None) -> tuple[int, ...]:
    """The process counts of a scaling study at ``size`` (the active size by default)."""
    return SCALING_RANKS[config.get_size(size).name]


def per_rank_batch(mode: str, batch_size: int, ranks: int) -> int:
    """The batch each rank runs: ``batch_size`` is the global batch in strong scaling, the per-rank
    batch in weak scaling."""
    if mode == "weak":
        return batch_size
    if mode != "strong":
        raise ValueError(f"unknown scaling mode {mode!r}; choose one of: {', '.join(STUDIES)}")
    if batch_size % ranks:
        raise ValueError(f"strong scaling splits the global batch {batch_size} over {ranks} ranks: "
                         f"choose a batch size divisible by every rank count")
    return batch_size // ranks


def table(summaries: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per run, ordered by rank count, with speed-up and efficiency against the smallest run."""
    rows = pd.DataFrame([{
        "ranks": s["world_size"],
        "batch_per_rank": s["config"]["batch_size"],
        "global_batch": s["global_batch_size"],
        "images_per_second": s["images_per_second"],
        "steady_iteration_seconds": max(r["steady_iteration_seconds"] for r in s["per_rank"]),
        "wall_seconds": sum(s["epoch_seconds"]),
        "steps": s["steps"],
        "mean_iteration_seconds": sum(s["epoch_seconds"]) / s["steps"],  # as Detectron2 reports s/it: a mean
        "device": s["device"],
        "measured": measured_rate(s),  # iteration by iteration, for the answers' verdicts
        **({"box_ap": s["box_ap"]} if "box_ap" in s else {}),  # a detector's runs: what the speed cost in accuracy
    } for s in summaries]).sort_values("ranks").reset_index(drop=True)
    base = rows.iloc[0]
    rows["speedup"] = rows["images_per_second"] / base["images_per_second"]
    rows["ideal"] = rows["ranks"] / base["ranks"]
    rows["efficiency"] = rows["speedup"] / rows["ideal"]
    return rows


def collect(run_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """The scaling table of runs already made (each folder holds a ``summary.json``)."""
    return table([RunFolder(folder).read_summary() for folder in run_dirs])


def study(ranks: Sequence[int], mode: str = "weak", out: str | Path | None = None, echo: bool = False,
          reuse: dict[int, str | Path] | None = None, **train_options: Any) -> pd.DataFrame:
    """Train at each rank count with torchrun on this machine and tabulate the throughput.

    ``train_options`` are the training command's options (``batch_size`` is global in strong
    scaling, per rank in weak scaling; it defaults to the course size's batch). ``reuse`` maps a
    rank count to a finished run with the same settings (one rank of a weak study at batch B is the
    one-rank point of a strong study at global batch B), which is read instead of run again.
    """
    batch = train_options.pop("batch_size", None) or config.get_size(train_options.get("size")).batch_size
    out = Path(out or config.runs_dir() / f"scaling-{mode}")

    def run(variant: Variant) -> dict[str, Any]:
        count = variant.options["ranks"]
        if reuse and count in reuse:
            return {"summary": RunFolder(reuse[count]).read_summary()}
        return {"summary": run_ranks(count, out / variant.folder_name, echo=echo, **train_options,
                                     batch_size=per_rank_batch(mode, batch, count)).summary}

    ran = run_variants([Variant(f"ranks {count}", ranks=count) for count in ranks], run, desc=f"{mode} scaling",
                       column="run")  # each in its folder ranks-N
    return table(list(ran["summary"]))


def lr_scaling(factor: int = 4, out: str | Path | None = None, **options: Any) -> pd.DataFrame:
    """The same epochs at the base batch and at ``factor`` times it: with the base learning rate,
    with the rate scaled linearly, and with the scaled rate after a warm-up.

    One process trains the large batch; notebook 07 showed that this is the training DDP does
    with ``factor`` ranks.
    """
    size = config.get_size(options.get("size"))
    batch = options.pop("batch_size", None) or size.batch_size
    lr = options.pop("lr", None) or size.lr
    study = LR_STUDY[size.name]
    epochs = options.setdefault("epochs", study["epochs"])
    options.setdefault("train_samples", study["train_samples"])
    warmup = min(1.0, epochs / 2)  # one epoch, or half of a shorter run
    out = Path(out or config.runs_dir() / "lr-scaling")
    cases = [Variant("base batch", batch_size=batch, lr=lr, warmup_epochs=0.0),
             Variant(f"{factor}x batch, same lr", batch_size=batch * factor, lr=lr, warmup_epochs=0.0),
             Variant(f"{factor}x batch, {factor}x lr", batch_size=batch * factor, lr=lr * factor, warmup_epochs=0.0),
             Variant(f"{factor}x batch, {factor}x lr, {warmup:g} epoch warm-up", batch_size=batch * factor,
                     lr=lr * factor, warmup_epochs=warmup)]

    def run(case: Variant) -> dict[str, Any]:
        row = {"batch": case.options["batch_size"], "lr": case.options["lr"],
               "warmup_epochs": case.options["warmup_epochs"], "run": out / case.folder_name}
        try:
            summary = train(**{**SCRATCH, **options, **case.options}, out=row["run"])
        except NonFiniteLossError as error:  # a diverged run is a result of this experiment, not a failure
            return {**row, "status": f"diverged: {error}".split(";")[0]}
        return {**row, "status": "ok", "steps": summary["steps"], "final_train_loss": summary["final_train_loss"],
                "test_top1": summary["test_top1"], "test_top5": summary["test_top5"]}

    return run_variants(cases, run, desc="cases", column="case")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.experiments.scaling_studies", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", help="process counts to run on this machine")
    parser.add_argument("--mode", choices=STUDIES, default="weak", help="weak (default) or strong scaling")
    parser.add_argument("--collect", nargs="+", metavar="RUN_DIR", help="tabulate finished runs instead")
    parser.add_argument("--csv", help="also write the table to this CSV file")
    args, train_flags = parser.parse_known_args(argv)
    train_flags = [flag for flag in train_flags if flag != "--"]
    if args.collect:
        result = collect(args.collect)
    elif args.ranks:
        result = study(args.ranks, args.mode, echo=True, **changed_options(train_flags))
    else:
        parser.error("give --ranks to run a study here, or --collect with finished runs")
    print(result.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.csv:
        write_text_atomic(Path(args.csv), result.to_csv(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
