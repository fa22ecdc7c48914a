"""Record notebook 05's precision-and-compilation progression on this machine, its step timed on one fixed batch.

Each stage trains the model on one batch already on the device (no loader, no epochs, no evaluation): warm-up
steps, then ``--rounds`` x ``--steps`` timed iterations; its images/s is the median of the rounds, with their
spread (the course's one notion of noise), its MFU is against the peak of the stage's own precision (strict fp32,
TF32 or 16-bit), and its joules per image come from the power drawn while it was timed. Both fp32 baselines are
measured: strict fp32 and PyTorch's default (convolutions in TF32 on NVIDIA GPUs since Ampere). The fused
optimizer comes before fp16, whose GradScaler then skips overflowing steps on the device instead of syncing.
Each stage is recorded the moment it is measured: a run cut short keeps the stages it finished.

    python benchmarks/progression.py --image-size 224 --model resnet50 --batch-size 128   # NVIDIA's configuration
    python benchmarks/progression.py --image-size 32 --model resnet18 --batch-size 128    # the workshop's step

Goals (recorded with the rows; ``course_utils.experiments.progression.progression_goals``): at 224 px the fastest 16-bit
stage >= 2x the TF32 baseline and >= 3x strict fp32 (NVIDIA's ResNet-50 v1.5: 2.63x on an A100, 3.26x on a V100);
at 32 px, where the step is launch-bound, CUDA graphs >= 1.5x the eager stage before them.
"""

from __future__ import annotations

import argparse

import pandas as pd

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.experiments import reference
from course_utils.experiments.progression import notebook_stages, progression_goals, step_progression


def _line(row: dict) -> str:
    """One stage as the benchmark prints it, the moment it is measured."""
    if row["status"] != "ok":
        return f"{row['stage']}: {row['status']}"
    figures = [f"{row['images_per_second']:.0f} images/s (±{row['spread']:.0%})", f"{row['step_ms']:.1f} ms a step"]
    figures += [f"{row[key]:.2f}{unit}" for key, unit in (("speedup", "x the fp32 baseline"),
                                                          ("speedup_over_strict", "x strict fp32"), ("mfu", " MFU"),
                                                          ("joules_per_image", " J per image"))
                if row.get(key) is not None and row[key] == row[key]]
    return f"{row['stage']}: " + ", ".join(figures)


def main() -> None:
    size = config.get_size()
    stages = notebook_stages()  # notebook 05's cell: the one design of the progression
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=size.model)
    parser.add_argument("--batch-size", type=int, default=size.batch_size)
    parser.add_argument("--image-size", type=int, default=size.image_size, choices=(32, 224))
    parser.add_argument("--steps", type=int, default=20, help="timed iterations of each round (default 20)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per stage; their spread is the noise")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations before the first round")
    parser.add_argument("--stages", default=None,
                        help="comma-separated numbers of the stages to time, 0-based (default: all; the others "
                             "still lend their options to the stages after them): "
                             + "; ".join(f"{number} {stage.name}" for number, stage in enumerate(stages)))
    args = parser.parse_args()
    only = None if args.stages is None else {stages[int(n)].name for n in args.stages.split(",")}
    device = device_name(default_device())
    setting = {"size": size.name, "model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
               "steps": args.steps, "rounds": args.rounds}
    path = None

    def record(rows: list[dict]) -> None:
        nonlocal path
        table = pd.DataFrame(rows)
        path = reference.record("progression", [{**setting, **row} for row in rows], device, reference.SYNTHETIC,
                                progression_goals(table, args.image_size), path)
        print(_line(rows[-1]), flush=True)

    table = step_progression(args.model, args.batch_size, args.image_size, args.steps, args.rounds, only,
                             args.warmup, on_row=record, stages=stages)
    for goal in progression_goals(table, args.image_size):
        print(goal.line())
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
