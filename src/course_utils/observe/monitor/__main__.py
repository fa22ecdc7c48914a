"""The command behind notebook 02's monitor, for a terminal beside a run: it prints device samples.

    python -m course_utils.observe.monitor [--backend B] [--interval S] [--once] [--json]

A table by default, JSON lines with ``--json``; ``--once`` prints one sample and exits, and
``--count N`` stops after N samples. Ctrl-C ends it otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from course_utils.observe.monitor.backends import BACKEND_NAMES, BackendUnavailable, open_backend

COLUMNS = (("index", 5, 0, "gpu"), ("utilization_percent", 6, 0, "util%"), ("memory_used_mib", 10, 0, "mem MiB"),
           ("memory_total_mib", 10, 0, "of MiB"), ("power_watts", 8, 1, "power W"),
           ("power_limit_watts", 8, 0, "limit W"), ("temperature_c", 6, 0, "temp C"), ("clock_mhz", 7, 0, "MHz"))


def _cell(value: float | None, width: int, decimals: int) -> str:
    return "-".rjust(width) if value is None else f"{value:>{width}.{decimals}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.observe.monitor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKEND_NAMES, default="auto", help="where readings come from")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--once", action="store_true", help="print one sample and exit")
    parser.add_argument("--count", type=int, help="stop after this many samples")
    parser.add_argument("--json", action="store_true", help="one JSON object per device and sample")
    args = parser.parse_args(argv)
    try:
        backend = open_backend(args.backend)
    except BackendUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    count = 1 if args.once else args.count
    if not args.json:
        print(f"backend {backend.name}")
        print(" ".join(title.rjust(width) for _, width, _, title in COLUMNS) + "  name")
    start, taken = time.perf_counter(), 0
    try:
        while count is None or taken < count:
            if taken:
                time.sleep(args.interval)
            seconds = time.perf_counter() - start
            for reading in backend.read():
                if args.json:
                    print(json.dumps({"seconds": round(seconds, 3), "backend": backend.name, **reading.as_dict()}))
                else:
                    values = reading.as_dict()
                    print(" ".join(_cell(values[key], width, decimals) for key, width, decimals, _ in COLUMNS)
                          + f"  {reading.name}")
            sys.stdout.flush()
            taken += 1
    except KeyboardInterrupt:
        pass
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
