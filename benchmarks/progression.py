"""Record notebook 05's precision-and-compilation progression on this machine.

The whole progression runs several times (rounds); each stage's images/s is the median over the
rounds, with its spread (the course's one notion of noise), and the speed-up is the median's over the
fp32 median. Compilation is paid in the first round only (inductor's cache), which the first-iteration column shows.

    COURSE_SIZE=workshop python benchmarks/progression.py [--rounds 3]   # on a GPU: tuned vs fp32, goal >= 5x
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.lessons import reference
from course_utils.lessons.precision import run_progression, stage_epochs
from course_utils.observe.noise import Measurement


def summarize(rounds: list[pd.DataFrame]) -> pd.DataFrame:
    """The first round's table with images/s and speed-up replaced by medians over all rounds, and each stage's
    spread over the rounds (:mod:`course_utils.observe.noise`)."""
    table = rounds[0].drop(columns=["run", "measured"], errors="ignore").copy()
    rates = pd.concat([r["images_per_second"] for r in rounds], axis=1)
    measured = [Measurement.of(row) for row in rates.itertuples(index=False)]
    table["images_per_second"] = [m.median for m in measured]
    table["spread"] = [m.spread for m in measured]  # unknown (NaN) with fewer than 3 rounds
    table["rates"] = [list(row) for row in rates.itertuples(index=False)]  # each round's, for later readings
    table["speedup"] = table["images_per_second"] / table["images_per_second"].iloc[0]
    table["rounds"] = rates.notna().sum(axis=1)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="times the whole progression runs (default 3)")
    rounds = parser.parse_args().rounds
    size = config.get_size()
    with tempfile.TemporaryDirectory() as out:
        table = summarize([run_progression(Path(out) / str(r), epochs=stage_epochs(), progress=False)
                           for r in range(rounds)])
    print(table.round(3).to_string())
    rows = [{"size": size.name, "model": size.model, "batch_size": size.batch_size, **row}
            for row in table.to_dict("records")]
    print(f"recorded in {reference.record('progression', rows, device_name(default_device()), reference.data_used())}")


if __name__ == "__main__":
    main()
