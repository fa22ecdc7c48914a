"""Notebook 04: is a run input-bound or compute-bound? Three throughputs and a one-line verdict.

In the spirit of NVIDIA's benchy, without its limits (it needs CUDA and exits the process):

- IO: iterate the training DataLoader and copy each batch to the device, no model;
- SYNTHETIC: the model trains on one fixed batch that already sits on the device, no loader;
- FULL: the real training step, loader and model together.

Each is measured in images per second over a set number of iterations after warm-up, timed in
:data:`ROUNDS` blocks whose spread the comparisons read (:mod:`course_utils.observe.noise`). If IO is
well below SYNTHETIC, the input pipeline cannot feed the model: input-bound. If SYNTHETIC is the
lower one, the model is the limit: compute-bound, unless FULL still falls well short of SYNTHETIC,
when a fast enough loader is not overlapped with the step (it runs between steps, or competes with
the model for the same cores). FULL shows what training actually gets.

    python -m course_utils.experiments.triage [train flags] [--steps 30] [--warmup 5] [--json]

:mod:`course_utils.experiments.loaders` sweeps the DataLoader's knobs and compares the loaders
through the same triage.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import torch

from course_utils.observe.clocks import timed_rate
from course_utils.observe.profiling import NO_RANGES
from course_utils.training.options import TrainOptions, build_parser
from course_utils.training.setup import Setup, prepare
from course_utils.training.step import device_batches, train_step

BALANCE = 0.10  # IO and SYNTHETIC within 10 % of each other count as balanced
ROUNDS = 3  # each mode is timed in this many blocks of its iterations: their spread is the measurement's noise
VERDICTS = ("input-bound", "balanced", "not overlapped", "compute-bound")


@dataclass(frozen=True)
class Triage:
    """The three throughputs (images per second) and what they mean together."""

    io: float
    synthetic: float
    full: float
    verdict: str  # one of VERDICTS
    explanation: str
    rates: dict[str, list[float]] = field(default_factory=dict)  # each mode's images/s, block by block

    def as_dict(self) -> dict:
        return asdict(self)


def loading_cost_us(full: float, synthetic: float) -> float:
    """Microseconds per image that training with the loader takes beyond the model alone."""
    return 1e6 / full - 1e6 / synthetic


def judge(io: float, synthetic: float, full: float) -> tuple[str, str]:
    """The verdict and its one-line explanation, with the ratios that justify it."""
    ratio = io / synthetic
    efficiency = f"FULL reaches {full / synthetic:.0%} of SYNTHETIC"
    if ratio < 1 - BALANCE:
        return "input-bound", (f"input-bound: the loader delivers {io:.0f} images/s, only {ratio:.2f}x what the "
                               f"model could train on ({synthetic:.0f}); {efficiency}. Feed it faster: more "
                               f"workers, pinned memory, lighter decoding, or augmentation on the GPU.")
    if ratio <= 1 + BALANCE:
        return "balanced", (f"balanced: loader and model run at about the same rate ({io:.0f} vs {synthetic:.0f} "
                            f"images/s); {efficiency}. Speeding up either alone gains little.")
    if full < (1 - BALANCE) * synthetic:
        return "not overlapped", (
            f"not overlapped: the loader alone could deliver {ratio:.2f}x what the model trains on ({io:.0f} vs "
            f"{synthetic:.0f} images/s), yet {efficiency}: loading still costs "
            f"{loading_cost_us(full, synthetic):.0f} us of every image's "
            f"time. It runs between the steps (no workers) or takes turns with the model for the same cores "
            f"(workers on a CPU-only machine). Workers on spare cores, a cheaper pipeline (DALI, augmentation "
            f"in batch) or the GPU hide it.")
    return "compute-bound", (f"compute-bound: the loader could deliver {ratio:.2f}x what the model trains "
                             f"on ({io:.0f} vs {synthetic:.0f} images/s); {efficiency}. Make the step "
                             f"faster: mixed precision, channels_last, compile, a larger batch.")


def _endless(setup: Setup) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches on the device, starting a new epoch whenever one ends."""
    while True:
        yield from device_batches(setup)


def _rounds(step: Callable[[], int], steps: int, warmup: int, device: torch.device) -> list[float]:
    """Images per second of ``step`` in :data:`ROUNDS` blocks that share ``steps`` iterations, after ``warmup``."""
    per_round = max(1, steps // ROUNDS)
    return [timed_rate(step, per_round, warmup if number == 0 else 0, device)[0] for number in range(ROUNDS)]


def measure(setup: Setup, steps: int = 30, warmup: int = 5) -> Triage:
    """IO, SYNTHETIC and FULL throughput of ``setup`` (the median of each mode's blocks) and the verdict."""
    setup.model.train()
    batches = _endless(setup)

    def io_step() -> int:
        return len(next(batches)[1])

    rates = {"io": _rounds(io_step, steps, warmup, setup.device)}
    fixed_images, fixed_labels = next(batches)

    def synthetic_step() -> int:
        train_step(setup, [(fixed_images, fixed_labels)], NO_RANGES)
        return len(fixed_labels)

    rates["synthetic"] = _rounds(synthetic_step, steps, warmup, setup.device)

    def full_step() -> int:
        images, labels = next(batches)
        train_step(setup, [(images, labels)], NO_RANGES)
        return len(labels)

    rates["full"] = _rounds(full_step, steps, warmup, setup.device)
    io, synthetic, full = (statistics.median(rates[mode]) for mode in ("io", "synthetic", "full"))
    verdict, explanation = judge(io, synthetic, full)
    return Triage(io, synthetic, full, verdict, explanation, rates)


def triage(steps: int = 30, warmup: int = 5, **options) -> Triage:
    """Triage from a notebook: ``triage(workers=0, input_delay_ms=50)`` takes the training options."""
    options.setdefault("progress", False)
    setup = prepare(TrainOptions(**options))
    try:
        return measure(setup, steps, warmup)
    finally:
        setup.loaders.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(prog="python -m course_utils.experiments.triage", description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="timed iterations of each mode (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations before each mode (default 5)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = vars(parser.parse_args(argv))
    steps, warmup, as_json = args.pop("steps"), args.pop("warmup"), args.pop("json")
    try:
        result = triage(steps, warmup, **args)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result.as_dict()))
    else:
        print(f"IO {result.io:.0f}  SYNTHETIC {result.synthetic:.0f}  FULL {result.full:.0f} images/s")
        print(result.explanation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
