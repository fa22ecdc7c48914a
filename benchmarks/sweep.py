"""Record notebook 02's model x batch-size sweep on this machine, for the notebook's reference table.

    COURSE_SIZE=workshop python benchmarks/sweep.py   # on a GPU: ResNet-18/50/152, batch 32 to 2048
"""

from __future__ import annotations

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.experiments import reference
from course_utils.experiments.sweep import sweep, sweep_size


def main() -> None:
    size = config.get_size()
    knobs = sweep_size()
    results = sweep(knobs.models, knobs.batch_sizes, steps=knobs.steps, rounds=knobs.rounds,
                    image_size=knobs.image_size)
    print(results.round(1).to_string())
    rows = [{"size": size.name, **row} for row in results.to_dict("records")]
    print(f"recorded in {reference.record('sweep', rows, device_name(default_device()), reference.SYNTHETIC)}")


if __name__ == "__main__":
    main()
