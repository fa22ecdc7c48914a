"""Record the memory ladder of notebook 09 on this machine: memory per rank by kind and speed of each rung.

    COURSE_SIZE=workshop python benchmarks/memory_ladder.py   # on 2+ GPUs: one rank per GPU, offload included
    COURSE_SIZE=ci python benchmarks/memory_ladder.py         # on a CPU: 2 gloo ranks, offload left out

``--model`` and ``--batch-size`` choose another set-up than the size's (e.g. ``--model resnet152
--image-size 224 --batch-size 32``, where the model's state matters more).
"""

from __future__ import annotations

import argparse
import tempfile

from course_utils import config
from course_utils.devices import device_name
from course_utils.lessons import data_parallel, memory_ladder, reference


def main() -> None:
    size = config.get_size()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=data_parallel.measured_steps(size.name))
    parser.add_argument("--model", default=size.model)
    parser.add_argument("--batch-size", type=int, default=size.batch_size)
    parser.add_argument("--image-size", type=int, default=size.image_size)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        ladder = memory_ladder.climb(steps=args.steps, out=out, model=args.model, batch_size=args.batch_size,
                                     image_size=args.image_size)
    print(ladder.round(1).to_string(index=False))
    shape = data_parallel.parallel_shape()
    measured = ladder.dropna(subset=["total_mib"]).drop(columns=["skipped"], errors="ignore")
    rows = [{"size": size.name, "model": args.model, "image_size": args.image_size, "batch_per_rank": args.batch_size,
             "steps": args.steps, **row} for row in measured.to_dict("records")]
    path = reference.record('memory_ladder', rows, device_name(shape.rank_device), reference.data_used())
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
