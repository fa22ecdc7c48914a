"""One cloud VM against two at the same batch per GPU, set beside a class that did the same (notebook 08 and
jobs/cloud/README.md's experiment).

That class trained a ResNet on ImageNet with DDP and AMP on AWS ``g4dn.2xlarge`` VMs (one NVIDIA T4 each) in
NVIDIA's NGC PyTorch container: 57 min 32 s on one VM, 31 min 18 s on two, both GPUs above 95 % utilization.
Its numbers are reported, not measured by this course; the learner's row comes from two runs' ``summary.json``.

    python -m course_utils.lessons.cloud_vms runs/cloud-1vm runs/cloud-2vm
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from course_utils.run_folder import RunFolder

CLASS_RESULT = {"who": "the class (2 x g4dn.2xlarge, T4)", "vms": (1, 2), "seconds": (57 * 60 + 32, 31 * 60 + 18),
                "gpu_utilization": "above 95 % on both"}


def _row(who: str, vms: tuple[int, int], seconds: tuple[float, float], utilization: str) -> dict[str, Any]:
    speedup = seconds[0] / seconds[1]
    return {"who": who, "seconds_fewer_vms": seconds[0], "seconds_more_vms": seconds[1], "speedup": speedup,
            "ideal": vms[1] / vms[0], "efficiency": speedup / (vms[1] / vms[0]), "gpu_utilization": utilization}


def comparison(small: dict[str, Any], large: dict[str, Any]) -> pd.DataFrame:
    """The class's row and this run's: wall time of the training epochs on fewer and more VMs, speed-up and
    efficiency; ``small`` and ``large`` are the two runs' summaries (same batch per GPU)."""
    if small["config"]["batch_size"] != large["config"]["batch_size"]:
        raise ValueError(f"the runs differ in batch per GPU ({small['config']['batch_size']} and "
                         f"{large['config']['batch_size']}): rerun one with the other's --batch-size")
    ranks = (small["world_size"], large["world_size"])
    seconds = (sum(small["epoch_seconds"]), sum(large["epoch_seconds"]))
    device = f"this run ({ranks[0]} and {ranks[1]} ranks, {large['device']})"
    utilization = "see each node's monitor" if large.get("monitor") else "not sampled (--monitor)"
    return pd.DataFrame([_row(CLASS_RESULT["who"], CLASS_RESULT["vms"], CLASS_RESULT["seconds"],
                              CLASS_RESULT["gpu_utilization"]), _row(device, ranks, seconds, utilization)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.lessons.cloud_vms", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("small", type=Path, help="run folder of the run on fewer VMs")
    parser.add_argument("large", type=Path, help="run folder of the run on more VMs")
    args = parser.parse_args(argv)
    try:
        table = comparison(RunFolder(args.small).read_summary(), RunFolder(args.large).read_summary())
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(table.to_string(index=False, float_format=lambda value: f"{value:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
