"""Notebook 04's loader studies: the DataLoader's knobs swept, a setting recommended, the loaders compared.

Every setting is judged by what training gets with it, not by the loader alone: a worker that
speeds up the loader but takes a core from the model makes training slower.
"""

from __future__ import annotations

import time
from dataclasses import asdict

import pandas as pd
import torch
from tqdm.auto import tqdm

from course_utils import devices
from course_utils.lessons.triage import loading_cost_us, triage
from course_utils.observe.profiling import NO_RANGES
from course_utils.training.options import TrainOptions
from course_utils.training.setup import Setup, prepare
from course_utils.training.step import device_batches, train_step


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
        for batch in device_batches(setup):
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
        cfg = TrainOptions(**{**options, **setting}).resolved()
        setup = prepare(TrainOptions(**{**asdict(cfg), "train_samples": cfg.batch_size * steps_per_epoch}))
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
