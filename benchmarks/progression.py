"""Record notebook 05's precision-and-compilation progression on this machine.

    COURSE_SIZE=workshop python benchmarks/progression.py   # on a GPU: the tuned stage vs fp32 (goal >= 5x)
"""

from __future__ import annotations

import tempfile

from course_utils import config, reference
from course_utils.devices import default_device
from course_utils.progression import run_progression
from course_utils.step import device_name


def main() -> None:
    size = config.get_size()
    with tempfile.TemporaryDirectory() as out:
        table = run_progression(out, epochs=size.progression_epochs, progress=False)
    table = table.drop(columns=["run"], errors="ignore")
    print(table.round(3).to_string())
    rows = [{"size": size.name, "model": size.model, "batch_size": size.batch_size, **row}
            for row in table.to_dict("records")]
    print(f"recorded in {reference.record('progression', rows, device_name(default_device()))}")


if __name__ == "__main__":
    main()
