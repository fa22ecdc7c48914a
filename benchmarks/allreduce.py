"""Record the all-reduce bandwidth sweep (notebook 08) between the devices of this machine.

    python benchmarks/allreduce.py                      # every GPU (NCCL/RCCL), or 2 CPU ranks (gloo)
    python benchmarks/allreduce.py --max-bytes 1G

Across nodes, use the job scripts (jobs/generic/allreduce.sbatch, jobs/lumi/allreduce.sbatch).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from course_utils import config
from course_utils.devices import device_name
from course_utils.doctor import allreduce
from course_utils.experiments import reference
from course_utils.experiments.machine_shape import parallel_shape
from course_utils.parallel.launch import launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-bytes", default=str(allreduce.MAX_BYTES[config.get_size().name]))
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    shape = parallel_shape()
    with tempfile.TemporaryDirectory() as out:
        path = Path(out) / "allreduce.json"
        result = launch(shape.ranks, "course_utils.doctor.allreduce", "--max-bytes", args.max_bytes, "--iterations",
                        str(args.iterations), "--out", str(path), "--device", shape.device)
        if not result.ok:
            raise SystemExit(f"the all-reduce sweep failed (exit {result.returncode})")
        rows = [{"ranks_ran_on": shape.rows_label(), **row} for row in json.loads(path.read_text())]
    print(f"recorded in {reference.record('allreduce', rows, device_name(shape.rank_device), reference.SYNTHETIC)}")


if __name__ == "__main__":
    main()
