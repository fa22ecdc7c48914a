"""Record notebook 04's loader study in steady state on this machine.

Each loader setting trains the active size's model on its data: in each of ``--rounds`` epochs, ``--warmup``
untimed steps after the epoch's start (worker start-up and the first batches' waits belong to them), then
``--steps`` timed steps training on the loader's batches (FULL), fetching them alone (IO) and training on one
fixed batch already on the device (SYNTHETIC); every timed batch comes from inside one epoch. FULL/SYNTHETIC is
the share of the model's own speed that training gets. The settings: the DataLoader as the course recommended
it before (4 workers, pageable memory), pinned, with every worker the cores allow, augmentation on the device
(gpu-aug), and the whole data set on the device (resident). Each setting is recorded the moment it is measured.

Goal: FULL/SYNTHETIC >= 0.95 with the recommended loaders: the whole data set on the device where it fits
(CIFAR-100 does), and the pinned DataLoader with every worker where it does not (ImageNet). The CIFAR-10 speed
record (airbench: 94 % in 2.59 s on one A100) keeps its data set and augmentation on the GPU.

    COURSE_SIZE=workshop python benchmarks/loaders.py [--steps 150] [--rounds 3]
"""

from __future__ import annotations

import argparse

import pandas as pd

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.experiments import loaders, reference
from course_utils.experiments.reference import Goal

SOURCE = ("the model never waits for data: training reaches the model's own speed within the 5 % a step varies by; "
          "KellerJordan/cifar10-airbench keeps CIFAR and its augmentation on the GPU for its records")


def recommended(settings: dict[str, dict]) -> list[str]:
    """The settings the course recommends: the whole data set on the device, and the pinned DataLoader with the
    most workers (the last pinned one of :func:`loaders.study_settings`)."""
    pinned = [name for name, setting in settings.items() if setting["loader"] == "torch" and setting["pin_memory"]]
    return [name for name in settings if name.startswith("resident")] + pinned[-1:]


def goals(table: pd.DataFrame, names: list[str]) -> list[Goal]:
    """FULL/SYNTHETIC of each recommended setting against :data:`loaders.STEADY_GOAL`."""
    found = []
    for name in names:
        row = table[table["setting"] == name]
        value = row.iloc[0].get("full_over_synthetic") if len(row) else None
        value = None if value is None or value != value else float(value)
        found.append(Goal(f"FULL/SYNTHETIC, {name}", value, f"at least {loaders.STEADY_GOAL:.2f}",
                          None if value is None else value >= loaders.STEADY_GOAL, SOURCE))
    return found


def main() -> None:
    size = config.get_size()
    warmup, steps = loaders.steady_steps()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=steps, help=f"timed iterations of each block (default {steps})")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed iterations after each epoch's start")
    parser.add_argument("--rounds", type=int, default=3, help="epochs per setting, one timed block each (default 3)")
    args = parser.parse_args()
    device = default_device()
    settings = loaders.study_settings(device.type == "cuda")
    names, path = recommended(settings), None

    def record(rows: list[dict]) -> None:
        nonlocal path
        row = rows[-1]
        shown = (f"FULL/SYNTHETIC {row['full_over_synthetic']:.3f} (IO {row['io']:.0f}, SYNTHETIC "
                 f"{row['synthetic']:.0f}, FULL {row['full']:.0f} images/s; {row['verdict']})"
                 if "full" in row else row["verdict"])
        print(f"{row['setting']}: {shown}", flush=True)
        recorded = [{"size": size.name, "model": size.model, "batch_size": size.batch_size, **row} for row in rows]
        path = reference.record("loaders", recorded, device_name(device), reference.data_used(),
                                goals(pd.DataFrame(rows), names), path)

    table = loaders.loader_study(settings, args.warmup, args.steps, args.rounds, on_row=record)
    for goal in goals(table, names):
        print(goal.line())
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
