"""Record the baseline of notebook 01 on this machine, for the notebook's reference table: its speed as the median
of its steady iterations with their spread, and its later epochs' time as their median with theirs (the course's
one notion of noise, :mod:`course_utils.observe.noise`), not a mean that hides how far they lie apart.

    COURSE_SIZE=workshop python benchmarks/baseline.py   # on a GPU: ResNet-18, real CIFAR-100
    COURSE_SIZE=ci python benchmarks/baseline.py         # on a laptop: the small CNN on tiny data
"""

from __future__ import annotations

import tempfile

from course_utils.experiments import reference
from course_utils.observe.metrics import load_run
from course_utils.observe.noise import Measurement
from course_utils.train import train


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        summary = train(out=out, progress=False)
        steady = load_run(out).steady_rate()  # images/s iteration by iteration after the warm-up
    cfg = summary["config"]
    later = Measurement.of(summary["epoch_seconds"][1:] or summary["epoch_seconds"])
    row = {"size": cfg["size"], "model": cfg["model"], "batch_size": cfg["batch_size"],
           "epochs": len(summary["epoch_seconds"]),
           "workers": cfg["workers"], "images_per_second": summary["images_per_second"],
           "steady_images_per_second": steady.median, "steady_spread": steady.spread,
           "first_epoch_seconds": summary["first_epoch_seconds"], "later_epoch_seconds": later.median,
           "later_epoch_spread": later.spread, "later_epochs": later.count,
           "first_iteration_ms": 1000 * summary["first_iteration_seconds"][0],
           "steady_iteration_ms": 1000 * summary["steady_iteration_seconds"], "test_top1": summary["test_top1"]}
    print(row)
    print(f"recorded in {reference.record('baseline', [row], summary['device'], reference.data_used())}")


if __name__ == "__main__":
    main()
