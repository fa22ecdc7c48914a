"""Record one device against DataParallel and DDP (notebooks 06 and 07) on this machine.

    COURSE_SIZE=workshop python benchmarks/parallel_modes.py   # on 2+ GPUs: DP and DDP over all of them
    COURSE_SIZE=ci python benchmarks/parallel_modes.py         # on a CPU: DDP with 2 gloo ranks, one thread each

Every mode runs the same per-device batch for the same number of steps (``--steps``, default
three times the size's); the rows are alternated over ``--repeats`` rounds so that drift on a
shared machine spreads over all of them.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.experiments import reference
from course_utils.experiments.machine_shape import gpu_count
from course_utils.experiments.modes import compare_modes
from course_utils.experiments.runs import measured_steps
from course_utils.observe.noise import Measurement


def main() -> None:
    size = config.get_size()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3 * measured_steps(size.name))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tables = []
    with tempfile.TemporaryDirectory() as out:
        for repeat in range(args.repeats):
            table = compare_modes(steps=args.steps, out=Path(out) / str(repeat))
            tables.append(table.drop(columns=["measured"]).assign(repeat=repeat))
    every = pd.concat(tables)
    summary = every.groupby("mode", sort=False).agg(
        devices=("devices", "first"), global_batch=("global_batch", "first"),
        images_per_second=("images_per_second", "median"),
        spread=("images_per_second", lambda v: Measurement.of(v).spread),
        speedup=("speedup", "median"), steady_iteration_seconds=("steady_iteration_seconds", "median")).reset_index()
    print(summary.round(3).to_string(index=False))
    rows = [{"size": size.name, "model": size.model, "batch_per_device": size.batch_size, "steps": args.steps,
             "repeats": args.repeats, "gpus": gpu_count(), **row} for row in summary.to_dict("records")]
    path = reference.record('parallel_modes', rows, device_name(default_device()), reference.data_used())
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
