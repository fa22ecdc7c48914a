"""Record notebook 04's loader comparison at this machine's recommended DataLoader setting.

Sweeps the DataLoader knobs, takes the recommended setting, then measures IO, SYNTHETIC and FULL
for the torch, DALI and gpu-aug loaders. Goal: FULL / SYNTHETIC >= 0.95 (the model never waits).

    COURSE_SIZE=workshop python benchmarks/loaders.py
"""

from __future__ import annotations

from course_utils import bench, config, reference
from course_utils.devices import default_device
from course_utils.step import device_name


def main() -> None:
    size = config.get_size()
    best = bench.recommend(bench.loader_sweep(size.loader_workers))
    setting = {k: v for k, v in best.items() if k != "images_per_second"}
    setting["prefetch_factor"] = None if setting["workers"] == 0 else int(setting["prefetch_factor"])
    print(f"recommended DataLoader setting: {setting}")
    table = bench.compare_loaders(steps=size.sweep_steps * 10, **setting)
    print(table.round(3).to_string())
    rows = [{"size": size.name, "model": size.model, "batch_size": size.batch_size, **setting, **row}
            for row in table.to_dict("records")]
    print(f"recorded in {reference.record('loaders', rows, device_name(default_device()))}")


if __name__ == "__main__":
    main()
