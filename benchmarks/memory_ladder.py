"""Record the memory ladder of notebook 09 on this machine: memory per rank by kind and speed of each rung.

    COURSE_SIZE=workshop python benchmarks/memory_ladder.py   # on 2+ GPUs: one rank per GPU, offload included
    COURSE_SIZE=ci python benchmarks/memory_ladder.py         # on a CPU: 2 gloo ranks, offload left out
    COURSE_SIZE=workshop python benchmarks/memory_ladder.py --one-gpu   # one GPU: one process, with and without
                                                                        # activation checkpointing, on the GPU

``--model`` and ``--batch-size`` choose another set-up than the size's (e.g. ``--model resnet152
--image-size 224 --batch-size 32``, where the model's state matters more).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import asdict

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.experiments import reference
from course_utils.experiments.ladder import climb
from course_utils.experiments.machine_shape import parallel_shape
from course_utils.experiments.runs import measured_steps


def main() -> None:
    size = config.get_size()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=measured_steps(size.name))
    parser.add_argument("--model", default=size.model)
    parser.add_argument("--batch-size", type=int, default=size.batch_size)
    parser.add_argument("--image-size", type=int, default=size.image_size)
    parser.add_argument("--one-gpu", action="store_true",
                        help="world size 1 on this process's GPU (a node with one GPU, where the ladder's ranks "
                             "would be CPU processes)")
    args = parser.parse_args()
    if args.one_gpu and default_device().type != "cuda":
        parser.error("--one-gpu measures this process's GPU, and there is none here")
    with tempfile.TemporaryDirectory() as out:
        ladder = climb(steps=args.steps, out=out, model=args.model, batch_size=args.batch_size,
                                     image_size=args.image_size, one_gpu=args.one_gpu)
    print(ladder.round(1).to_string(index=False))
    shape = parallel_shape()
    ran_on = "one GPU, world size 1" if args.one_gpu else shape.rows_label()
    device = default_device() if args.one_gpu else shape.rank_device
    measured = ladder.dropna(subset=["total_mib"]).drop(columns=["skipped"], errors="ignore")
    rows = [{"size": size.name, "model": args.model, "image_size": args.image_size, "batch_per_rank": args.batch_size,
             "steps": args.steps, "ranks_ran_on": ran_on, **row, "measured": asdict(row["measured"])}
            for row in measured.to_dict("records")]
    path = reference.record('memory_ladder', rows, device_name(device), reference.data_used())
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
