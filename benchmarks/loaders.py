"""Record notebook 04's loader comparison at this machine's recommended DataLoader setting.

Sweeps the DataLoader knobs and takes the recommended setting (judged by training throughput, the
median of several sweeps), then measures IO, SYNTHETIC and FULL for the torch, DALI and gpu-aug
loaders in as many rounds, and records the medians with the spread of FULL/SYNTHETIC.
Goal: FULL/SYNTHETIC >= 0.95 (the model never waits).

    COURSE_SIZE=workshop python benchmarks/loaders.py [--rounds 3]
"""

from __future__ import annotations

import argparse

import pandas as pd

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.lessons import data_loading, reference, triage
from course_utils.observe.noise import Measurement

RATES = ["io", "synthetic", "full"]
KNOBS = ["workers", "pin_memory", "persistent_workers", "prefetch_factor"]


def median_sweep(sweeps: pd.DataFrame) -> pd.DataFrame:
    """Each setting's median IO and FULL over repeated sweeps: one slow moment cannot pick the setting."""
    return sweeps.groupby(KNOBS, dropna=False, sort=False)[["io", "full"]].median().reset_index()


def summarize(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per loader: the median of each rate and of FULL/SYNTHETIC over the rounds, their spread, and
    the verdict of the medians; a loader that cannot run keeps its reason."""
    rows = []
    for loader, runs in rounds.groupby("loader", sort=False):
        ran = runs.dropna(subset=["full"])
        if ran.empty:
            rows.append({"loader": loader, "verdict": runs["verdict"].iloc[0]})
            continue
        medians = ran[RATES].median()
        ratio = Measurement.of(ran["full_over_synthetic"])
        rows.append({"loader": loader, **medians.to_dict(), "full_over_synthetic": ratio.median,
                     "full_over_synthetic_spread": ratio.spread,
                     "loading_us_per_image": triage.loading_cost_us(medians["full"], medians["synthetic"]),
                     "rounds": len(ran), "verdict": triage.judge(*medians[RATES])[0]})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="triage rounds per loader (default 3)")
    rounds = parser.parse_args().rounds
    size = config.get_size()
    sweep = median_sweep(pd.concat([data_loading.loader_sweep(data_loading.loader_workers()) for _ in range(rounds)]))
    print(sweep.round(1).to_string())
    setting = data_loading.recommend(sweep)
    print(f"recommended DataLoader setting: {setting}")
    table = summarize(pd.concat([data_loading.compare_loaders(steps=data_loading.triage_steps() * 2, **setting)
                                 for _ in range(rounds)]))
    print(table.round(3).to_string())
    rows = [{"size": size.name, "model": size.model, "batch_size": size.batch_size, **setting, **row}
            for row in table.to_dict("records")]
    print(f"recorded in {reference.record('loaders', rows, device_name(default_device()), reference.data_used())}")


if __name__ == "__main__":
    main()
