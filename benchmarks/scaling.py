"""Record weak and strong scaling (notebook 08) over the devices of this machine.

    COURSE_SIZE=workshop python benchmarks/scaling.py --model resnet50   # 1, 2, 4, 8 GPUs
    COURSE_SIZE=ci python benchmarks/scaling.py                          # 1 and 2 CPU ranks

The goal on GPUs: at least 90 % efficiency at 8 GPUs for ResNet-50 on CIFAR-100-sized inputs
(weak scaling). For several nodes, submit the job scripts with --nodes 1, 2, 4 and tabulate the
finished runs with ``python -m course_utils.experiments.scaling_studies --collect``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from course_utils import config
from course_utils.devices import device_name
from course_utils.experiments import reference, scaling_studies
from course_utils.experiments.machine_shape import parallel_shape
from course_utils.experiments.runs import measured_steps


def main() -> None:
    size = config.get_size()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=size.model)
    parser.add_argument("--steps", type=int, default=3 * measured_steps(size.name))
    args = parser.parse_args()
    shape = parallel_shape()
    counts = [count for count in scaling_studies.scaling_ranks(size.name) if count <= shape.ranks]
    options = {"model": args.model, "max_steps": args.steps, "device": shape.device}
    with tempfile.TemporaryDirectory() as out:
        weak = scaling_studies.study(counts, "weak", out=Path(out) / "weak", **options)
        strong = scaling_studies.study(counts, "strong", batch_size=size.batch_size, out=Path(out) / "strong",
                               reuse={1: Path(out) / "weak" / "ranks-1"}, **options)
    table = pd.concat({"weak": weak, "strong": strong}, names=["study"]).reset_index(level=0)
    print(table.round(3).to_string(index=False))
    rows = [{"size": size.name, "model": args.model, "steps": args.steps, "ranks_ran_on": shape.rows_label(), **row}
            for row in table.to_dict("records")]
    print(f"recorded in {reference.record('scaling', rows, device_name(shape.rank_device), reference.data_used())}")


if __name__ == "__main__":
    main()
