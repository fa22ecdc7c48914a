"""Is a run input-bound or compute-bound? Three throughputs and a one-line verdict.

In the spirit of NVIDIA's benchy, without its limits (it needs CUDA and exits the process):

- IO: iterate the training DataLoader and copy each batch to the device, no model;
- SYNTHETIC: the model trains on one fixed batch that already sits on the device, no loader;
- FULL: the real training step, loader and model together.

Each is measured in images per second over a set number of iterations after warm-up. If IO is
well below SYNTHETIC, the input pipeline cannot feed the model: input-bound. If SYNTHETIC is the
lower one, the model is the limit: compute-bound, unless FULL still falls well short of SYNTHETIC,
when a fast enough loader is not overlapped with the step (it runs between steps, or competes with
the model for the same cores). FULL shows what training actually gets.

    python -m course_utils.bench [train flags] [--steps 30] [--warmup 5] [--json]

It also sweeps the DataLoader's knobs (workers, pinned memory, persistent workers, prefetch) and
compares the loaders (torch, DALI, GPU augmentation) through the same triage.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import pandas as pd
import torch
from tqdm.auto import tqdm

from course_utils import devices
from course_utils.profiling import NO_RANGES
from course_utils.run_config import TrainConfig
from course_utils.step import Setup, next_batch, prepare, train_step
from course_utils.train import build_parser

BALANCE = 0.10  # IO and SYNTHETIC within 10 % of each other count as balanced
VERDICTS = ("input-bound", "balanced", "not overlapped", "compute-bound")


@dataclass(frozen=True)
class Triage:
    """The three throughputs (images per second) and what they mean together."""

    io: float
    synthetic: float
    full: float
    verdict: str  # one of VERDICTS
    explanation: str

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


def _rate(step: Callable[[], int], steps: int, warmup: int, setup: Setup) -> float:
    """Images per second of ``step`` (which returns its batch size) after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    devices.synchronize(setup.device)
    start = time.perf_counter()
    images = sum(step() for _ in range(steps))
    devices.synchronize(setup.device)
    return images / (time.perf_counter() - start)


def _epoch(setup: Setup):
    """One pass over the training loader, each batch on the device as training would see it."""
    iterator = iter(setup.loaders.train)
    while (batch := next_batch(iterator, setup.device, NO_RANGES, setup.cfg.channels_last,
                               setup.loaders.train_on_device)) is not None:
        yield batch


def _endless(setup: Setup):
    """Batches on the device, starting a new epoch whenever one ends."""
    while True:
        yield from _epoch(setup)


def measure(setup: Setup, steps: int = 30, warmup: int = 5) -> Triage:
    """IO, SYNTHETIC and FULL throughput of ``setup`` and the verdict."""
    setup.model.train()
    batches = _endless(setup)

    def io_step() -> int:
        return len(next(batches)[1])

    io = _rate(io_step, steps, warmup, setup)
    fixed_images, fixed_labels = next(batches)

    def synthetic_step() -> int:
        train_step(setup, [(fixed_images, fixed_labels)], NO_RANGES)
        return len(fixed_labels)

    synthetic = _rate(synthetic_step, steps, warmup, setup)

    def full_step() -> int:
        images, labels = next(batches)
        train_step(setup, [(images, labels)], NO_RANGES)
        return len(labels)

    full = _rate(full_step, steps, warmup, setup)
    verdict, explanation = judge(io, synthetic, full)
    return Triage(io, synthetic, full, verdict, explanation)


def triage(steps: int = 30, warmup: int = 5, **options) -> Triage:
    """Triage from a notebook: ``triage(workers=0, input_delay_ms=50)`` takes the training options."""
    options.setdefault("progress", False)
    setup = prepare(TrainConfig(**options))
    try:
        return measure(setup, steps, warmup)
    finally:
        setup.loaders.close()


def _warm(setup: Setup) -> None:
    """One untimed training step on a random batch, so the first timed step pays no set-up costs."""
    cfg = setup.cfg
    images = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, device=setup.device)
    labels = torch.zeros(cfg.batch_size, dtype=torch.long, device=setup.device)
    train_step(setup, [(images, labels)], NO_RANGES)
    devices.synchronize(setup.device)


def epochs_rate(setup: Setup, epochs: int = 2, train: bool = False) -> float:
    """Images per second of whole passes over the training loader, iterator start included: this
    is where worker start-up and persistent workers show. Each batch is copied to the device (IO),
    and with ``train`` also trained on (FULL)."""
    images = 0
    devices.synchronize(setup.device)
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in _epoch(setup):
            if train:
                train_step(setup, [batch], NO_RANGES)
            images += len(batch[1])
    devices.synchronize(setup.device)
    return images / (time.perf_counter() - start)


def loader_settings(workers: tuple[int, ...], gpu: bool) -> list[dict]:
    """Every combination of the DataLoader knobs, leaving out those that mean nothing here: prefetch
    and persistence without workers, pinned memory without a GPU to copy to."""
    pins = (False, True) if gpu else (False,)
    settings = [{"workers": 0, "pin_memory": pin, "persistent_workers": False, "prefetch_factor": None}
                for pin in pins]
    settings += [{"workers": w, "pin_memory": pin, "persistent_workers": persistent, "prefetch_factor": prefetch}
                 for w in workers if w > 0 for pin in pins for persistent in (False, True) for prefetch in (2, 4)]
    return settings


def loader_sweep(workers: tuple[int, ...], steps_per_epoch: int = 8, epochs: int = 2, **options) -> pd.DataFrame:
    """For every setting of :func:`loader_settings`: the loader alone (``io``) and training with it
    (``full``), in images per second over whole short epochs (:func:`epochs_rate`)."""
    options.setdefault("progress", False)
    rows = []
    gpu = devices.default_device().type == "cuda"
    for setting in tqdm(loader_settings(workers, gpu), desc="loader settings", unit="setting"):
        cfg = TrainConfig(**{**options, **setting}).resolved()
        setup = prepare(TrainConfig(**{**asdict(cfg), "train_samples": cfg.batch_size * steps_per_epoch}))
        try:
            io = epochs_rate(setup, epochs)
            _warm(setup)
            rows.append({**setting, "io": io, "full": epochs_rate(setup, epochs, train=True)})
        finally:
            setup.loaders.close()
    return pd.DataFrame(rows)


def recommend(table: pd.DataFrame, within: float = 0.95) -> dict:
    """The cheapest setting (fewest workers) whose training throughput is within ``within`` of the
    best, as options for :func:`triage` or ``train``.

    Judged by FULL, not by the loader alone: a worker that speeds up the loader but takes a core
    from the model (a CPU-only machine) makes training slower, and more workers than it takes to
    keep the model fed only cost memory and start-up time.
    """
    good = table[table["full"] >= within * table["full"].max()]
    best = good.sort_values(["workers", "full"], ascending=[True, False]).iloc[0]
    workers = int(best["workers"])
    return {"workers": workers, "pin_memory": bool(best["pin_memory"]),
            "persistent_workers": bool(best["persistent_workers"]),
            "prefetch_factor": int(best["prefetch_factor"]) if workers > 0 else None}


def compare_loaders(loaders: tuple[str, ...] = ("torch", "dali", "gpu-aug"), steps: int = 30, warmup: int = 5,
                    **options) -> pd.DataFrame:
    """IO, SYNTHETIC and FULL for each loader; a loader that cannot run here says why."""
    rows = []
    for loader in loaders:
        try:
            result = triage(steps, warmup, loader=loader, **options)
        except RuntimeError as error:  # DaliUnavailable and device errors name their reason
            rows.append({"loader": loader, "verdict": f"not available: {error}"})
            continue
        rows.append({"loader": loader, "io": result.io, "synthetic": result.synthetic, "full": result.full,
                     "full_over_synthetic": result.full / result.synthetic,
                     "loading_us_per_image": loading_cost_us(result.full, result.synthetic), "verdict": result.verdict})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.prog = "python -m course_utils.bench"
    parser.description = __doc__
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
