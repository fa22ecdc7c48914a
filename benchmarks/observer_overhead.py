"""What do the monitor and the profiler cost a training run?

Runs the same short training (the active size's model and data) plainly, with ``--monitor`` and
with ``--trace``, alternating the three so that drifts of the machine hit all alike, and compares
the medians of steady-state images per second. Goal for the monitor: <= 1 % slower.

    python benchmarks/observer_overhead.py [--steps 120] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile

from course_utils.lessons import reference
from course_utils.observe.noise import Measurement, compare, spread_text
from course_utils.train import train

MODES = {"plain": {}, "monitor": {"monitor": "auto", "monitor_interval": 0.5}, "trace": {"trace": "TRACE"}}


def run(mode: str, steps: int) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as out:
        options = {key: (f"{out}/trace" if value == "TRACE" else value) for key, value in MODES[mode].items()}
        summary = train(out=f"{out}/run", epochs=100, max_steps=steps, progress=False, **options)
    return summary["images_per_second"], summary["device"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120, help="iterations per run; the first fifth is warm-up")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each mode, alternating")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    device = ""
    for repeat in range(args.repeats):
        for mode in MODES:
            rate, device = run(mode, args.steps)
            rates[mode].append(rate)
        print(f"repeat {repeat + 1}: " + ", ".join(f"{mode} {values[-1]:.1f}" for mode, values in rates.items()))
    plain = Measurement.of(rates["plain"])
    rows = []
    for mode, values in rates.items():
        measured = Measurement.of(values)
        cost = compare(plain, measured)  # plain over this mode: above 1 where observing costs
        rows.append({"mode": mode, "steps": args.steps, "repeats": args.repeats, "images_per_second": measured.median,
                     "spread": measured.spread, "runs": values, "cost_percent": 100 * (cost.ratio - 1),
                     "verdict": cost.verdict})
        print(f"{mode:>8}: median {measured.median:.1f} images/s ({spread_text(measured)}); plain over it: "
              f"{cost.ratio:.3f}x, {cost.verdict}")
    print(f"recorded in {reference.record('observer_overhead', rows, device, reference.data_used())}")


if __name__ == "__main__":
    main()
