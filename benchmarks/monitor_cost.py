"""Record what the GPU monitor (``--monitor``) costs a training step, measured where it can be seen.

One process trains the active size's model on one fixed batch already on the device; each round runs three
blocks of ``--steps`` iterations: plain, monitored (sampling every ``--interval`` seconds, as ``--monitor``
does), plain again. The two plain blocks around each monitored one differ only by chance: their difference is
the noise floor, printed beside the cost. Goal: the monitor costs at most 1 %, and the floor is below that, so
that the measurement can tell.

    python benchmarks/monitor_cost.py [--steps 150] [--rounds 5] [--interval 0.5]
"""

from __future__ import annotations

import argparse

from course_utils import config
from course_utils.devices import default_device, device_name
from course_utils.experiments import reference
from course_utils.experiments.monitor_cost import monitor_cost, monitor_cost_goals, monitor_cost_reading
from course_utils.observe.monitor import Monitor


def main() -> None:
    size = config.get_size()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=size.model)
    parser.add_argument("--batch-size", type=int, default=size.batch_size)
    parser.add_argument("--image-size", type=int, default=size.image_size, choices=(32, 224))
    parser.add_argument("--steps", type=int, default=150, help="iterations of each block (default 150)")
    parser.add_argument("--rounds", type=int, default=5, help="plain / monitored / plain rounds (default 5)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples (--monitor's 0.5)")
    args = parser.parse_args()
    device = default_device()
    table = monitor_cost(args.model, args.batch_size, args.steps, args.rounds, args.image_size,
                         make_monitor=lambda on: Monitor("auto", args.interval, on))
    print(table.round(4).to_string(index=False))
    cost, floor, comparison = monitor_cost_reading(table)
    print(f"cost {cost.median:+.2%} (the middle 80 % of {cost.count} rounds: {cost.low:+.2%} to {cost.high:+.2%}), "
          f"noise floor {floor.median:.2%}; monitored against plain: {comparison.sentence()}")
    rows = [{"size": size.name, "model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
             "interval": args.interval, **row} for row in table.to_dict("records")]
    rows.append({"size": size.name, "model": args.model, "round": "all", "cost": cost.median, "cost_low": cost.low,
                 "cost_high": cost.high, "noise_floor": floor.median, "verdict": comparison.verdict})
    found = monitor_cost_goals(table)
    for goal in found:
        print(goal.line())
    path = reference.record("monitor_cost", rows, device_name(device), reference.SYNTHETIC, found)
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
