"""Record the detector's seconds per iteration per world size at a fixed global batch (notebook 10).

    COURSE_SIZE=workshop python benchmarks/detection.py --steps 200        # R50-FPN on COCO 2017, 1..N GPUs
    COURSE_SIZE=ci python benchmarks/detection.py                          # the small detector, CPU ranks
    COURSE_SIZE=workshop python benchmarks/detection.py --one-gpu          # R50-FPN on this GPU, world size 1

The global batch is 16 at workshop size on 8 devices (the team's 1x recipe: 16/N images per GPU);
``--global-batch`` sets another. Rows hold s/it, images per second, speed-up and efficiency, beside
the cluster team's A100 figures in notebook 10.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import asdict

from course_utils import config
from course_utils.data import coco
from course_utils.devices import default_device, device_name
from course_utils.experiments import detection_runs, reference
from course_utils.experiments.machine_shape import parallel_shape
from course_utils.experiments.runs import measured_steps
from course_utils.training.detection_models import DETECTION_RECIPES


def main() -> None:
    size = config.get_size()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=measured_steps(size.name))
    parser.add_argument("--global-batch", type=int, default=None)
    parser.add_argument("--amp", default="off", choices=("off", "fp16", "bf16"))
    parser.add_argument("--one-gpu", action="store_true", help="one process on this GPU, world size 1, at the "
                                                                 "recipe's batch (a node with one GPU, where the "
                                                                 "ranks would be CPU processes)")
    args = parser.parse_args()
    if args.one_gpu and default_device().type != "cuda":
        parser.error("--one-gpu measures this process's GPU, and there is none here")
    shape = parallel_shape()
    with tempfile.TemporaryDirectory() as out:
        if args.one_gpu:  # the recipe's batch on one process, its rate scaled to it
            table = detection_runs.amp_effect((args.amp,), out=out, max_steps=args.steps)
        else:
            table = detection_runs.fixed_global_batch(global_batch=args.global_batch, out=out, max_steps=args.steps,
                                                 amp=args.amp)
    print(table.round(3).to_string(index=False))
    model = DETECTION_RECIPES[size.name].model
    ran_on = "one GPU, world size 1" if args.one_gpu else shape.rows_label()
    rows = [{"size": size.name, "model": model, "steps": args.steps, "amp": args.amp, "ranks_ran_on": ran_on, **row,
             "measured": asdict(row["measured"]) if "measured" in row else None}
            for row in table.to_dict("records")]
    device = default_device() if args.one_gpu else shape.rank_device
    data = coco.kind(detection_runs.detection_data(size.name)[0])
    path = reference.record('detection', rows, device_name(device), data)
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
