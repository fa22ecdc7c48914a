"""Record notebook 02's model x batch-size sweep on this machine, for the notebook's reference table.

    COURSE_SIZE=workshop python benchmarks/sweep.py   # on a GPU: ResNet-18/50/152, batch 64 to 16384
"""

from __future__ import annotations

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.lessons import reference
from course_utils.lessons.sweep import sweep


def main() -> None:
    size = config.get_size()
    results = sweep(size.sweep_models, size.sweep_batch_sizes, steps=size.sweep_steps,
                    image_size=size.sweep_image_size)
    print(results.round(1).to_string())
    rows = [{"size": size.name, **row} for row in results.to_dict("records")]
    print(f"recorded in {reference.record('sweep', rows, device_name(default_device()), reference.SYNTHETIC)}")


if __name__ == "__main__":
    main()
