"""Record the baseline of notebook 01 on this machine, for the notebook's reference table.

    COURSE_SIZE=workshop python benchmarks/baseline.py   # on a GPU: ResNet-18, real CIFAR-100
    COURSE_SIZE=ci python benchmarks/baseline.py         # on a laptop: the small CNN on tiny data
"""

from __future__ import annotations

import statistics
import tempfile

from course_utils.experiments import reference
from course_utils.train import train


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        summary = train(out=out, progress=False)
    cfg = summary["config"]
    later = summary["epoch_seconds"][1:] or summary["epoch_seconds"]
    row = {"size": cfg["size"], "model": cfg["model"], "batch_size": cfg["batch_size"],
           "epochs": len(summary["epoch_seconds"]),
           "workers": cfg["workers"], "images_per_second": summary["images_per_second"],
           "first_epoch_seconds": summary["first_epoch_seconds"], "later_epoch_seconds": statistics.mean(later),
           "first_iteration_ms": 1000 * summary["first_iteration_seconds"][0],
           "steady_iteration_ms": 1000 * summary["steady_iteration_seconds"], "test_top1": summary["test_top1"]}
    print(row)
    print(f"recorded in {reference.record('baseline', [row], summary['device'], reference.data_used())}")


if __name__ == "__main__":
    main()
