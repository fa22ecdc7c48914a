"""Notebook 04's experiments and the loader benchmark: the DataLoader's knobs swept and a setting recommended, the
loaders compared through the triage, and the loader study in steady state. Every setting is judged by what training
gets with it, not by the loader alone: a worker that speeds up the loader but takes a core from the model makes
training slower. The sweep's worker counts and the triage's iterations are sized by the course size here."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

import pandas as pd
import torch

from course_utils import config, devices
from course_utils.experiments.runs import Variant, run_variants
from course_utils.experiments.triage import judge, loading_cost_us, triage
from course_utils.observe.clocks import timed_rate
from course_utils.observe.noise import Measurement, compare
from course_utils.observe.profiling import NO_RANGES
from course_utils.training.options import TrainOptions
from course_utils.training.setup import Setup, prepare
from course_utils.training.step import device_batches, train_step

LOADER_WORKERS = {"ci": (2,), "workshop": (1, 2, 4, 7)}  # worker counts of the DataLoader sweep


TRIAGE_STEPS = {"ci": 20, "workshop": 100}  # timed iterations of each triage mode


def loader_workers(size: str | None = None) -> tuple[int, ...]:
    """The worker counts the sweep tries at the active course size (or at ``size``)."""
    return LOADER_WORKERS[config.get_size(size).name]


def triage_steps(size: str | None = None) -> int:
    """Timed iterations of each of the triage's modes at the active course size (or at ``size``)."""
    return TRIAGE_STEPS[config.get_size(size).name]


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

    def run(setting: Variant) -> dict:
        cfg = TrainOptions(**{**options, **setting.options}).resolved()
        setup = prepare(TrainOptions(**{**asdict(cfg), "train_samples": cfg.batch_size * steps_per_epoch}))
        try:
            io = epochs_rate(setup, epochs)
            _warm(setup)
            return {**setting.options, "io": io, "full": epochs_rate(setup, epochs, train=True)}
        finally:
            setup.loaders.close()

    settings = [Variant(setting_name(setting), **setting)
                for setting in loader_settings(workers, devices.default_device().type == "cuda")]
    return run_variants(settings, run, desc="loader settings", column="setting")


def setting_name(setting: dict) -> str:
    """A DataLoader setting in words: ``2 workers, pinned, persistent, prefetch 4``."""
    return ", ".join([f"{setting['workers']} workers", *(["pinned"] if setting["pin_memory"] else []),
                      *(["persistent"] if setting["persistent_workers"] else []),
                      *([f"prefetch {setting['prefetch_factor']}"] if setting["prefetch_factor"] else [])])


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


def compare_loaders(loaders: tuple[str, ...] = ("torch", "dali", "gpu-aug", "resident"), steps: int = 30,
                    warmup: int = 5, **options) -> pd.DataFrame:
    """IO, SYNTHETIC and FULL for each loader; a loader that cannot run here says why."""

    def run(loader: Variant) -> dict:
        try:
            result = triage(steps, warmup, **loader.options, **options)
        except RuntimeError as error:  # DaliUnavailable and device errors name their reason
            return {"verdict": f"not available: {error}"}
        return {"io": result.io, "synthetic": result.synthetic, "full": result.full,
                "full_over_synthetic": result.full / result.synthetic,
                "loading_us_per_image": loading_cost_us(result.full, result.synthetic), "verdict": result.verdict,
                "rates": result.rates}

    return run_variants([Variant(loader, loader=loader) for loader in loaders], run, desc="loaders", column="loader")


STEADY_STEPS = {"ci": 10, "workshop": 150}  # timed iterations of each block of the steady-state study


STEADY_WARMUP = {"ci": 2, "workshop": 20}  # untimed iterations after each epoch's start: the iterator's own start-up


STEADY_GOAL = 0.95  # FULL / SYNTHETIC with the recommended loader: the model never waits for data


def steady_steps(size: str | None = None) -> tuple[int, int]:
    """Warm-up and timed iterations of the steady-state loader study at the active size (or at ``size``)."""
    name = config.get_size(size).name
    return STEADY_WARMUP[name], STEADY_STEPS[name]


def study_settings(gpu: bool, workers: int | None = None) -> dict[str, dict]:
    """The loaders the steady-state study compares, by name: the DataLoader as the course recommended it before
    (4 workers, pageable memory), pinned, with every worker the process's cores allow, augmentation on the
    device, and the whole data set on the device. Pinning means nothing without a GPU: there those rows are
    left out."""
    workers = config.get_size().workers if workers is None else workers
    dataloader = {"loader": "torch", "persistent_workers": True, "prefetch_factor": 4}
    settings = {"torch, 4 workers, pageable": {**dataloader, "workers": 4, "pin_memory": False}}
    if gpu:
        settings["torch, 4 workers, pinned"] = {**dataloader, "workers": 4, "pin_memory": True}
        settings[f"torch, {workers} workers, pinned"] = {**dataloader, "workers": workers, "pin_memory": True}
    settings["gpu-aug, 2 workers"] = {"loader": "gpu-aug", "workers": 2, "pin_memory": gpu,
                                      "persistent_workers": True}
    settings["resident (whole data set on the device)"] = {"loader": "resident", "workers": 0}
    return settings


def _steady_epoch(setup: Setup, epoch: int, warmup: int, steps: int) -> dict[str, float]:
    """FULL, IO and SYNTHETIC images/s of one epoch of :func:`steady_state`, after its warm-up."""
    setup.loaders.set_epoch(epoch)
    batches = device_batches(setup)
    fixed = None
    for _ in range(warmup):
        fixed = next(batches)
        train_step(setup, [fixed], NO_RANGES)
    fixed = fixed or next(batches)

    def full_step() -> int:
        batch = next(batches)
        train_step(setup, [batch], NO_RANGES)
        return len(batch[1])

    def synthetic_step() -> int:
        train_step(setup, [fixed], NO_RANGES)
        return len(fixed[1])

    try:
        return {"full": timed_rate(full_step, steps, 0, setup.device)[0],
                "io": timed_rate(lambda: len(next(batches)[1]), steps, 0, setup.device)[0],
                "synthetic": timed_rate(synthetic_step, steps, 0, setup.device)[0]}
    finally:
        batches.close()  # the epoch ends here: its iterator (and workers that do not persist) with it


def steady_state(warmup: int, steps: int, rounds: int, **options) -> dict:
    """IO, SYNTHETIC and FULL of one loader setting in steady state: in each of ``rounds`` epochs, ``warmup``
    untimed training steps after the epoch's start (the workers' start-up, the first batches' waits), then
    ``steps`` timed steps training on the loader's batches (FULL), ``steps`` fetching them alone (IO), and
    ``steps`` training on one fixed batch already on the device (SYNTHETIC). Every timed batch comes from
    inside one epoch: a ValueError where an epoch is shorter than that."""
    options.setdefault("progress", False)
    setup = prepare(TrainOptions(**options))
    try:
        per_epoch = len(setup.loaders.train)
        if max(warmup, 1) + 2 * steps > per_epoch:
            raise ValueError(f"{warmup} warm-up and 2 x {steps} timed steps do not fit in one epoch of {per_epoch} "
                             "batches, and a timing across an epoch's end would include the next one's start; use "
                             "more samples or fewer steps")
        rates: dict[str, list[float]] = {"io": [], "synthetic": [], "full": []}
        for epoch in range(rounds):
            for name, rate in _steady_epoch(setup, epoch, warmup, steps).items():
                rates[name].append(rate)
        ratios = [full / synthetic for full, synthetic in zip(rates["full"], rates["synthetic"])]
        medians = {name: Measurement.of(values).median for name, values in rates.items()}
        ratio = Measurement.of(ratios)
        return {**medians, "full_over_synthetic": ratio.median, "full_over_synthetic_low": ratio.low,
                "full_over_synthetic_high": ratio.high, "rates": rates, "rounds": rounds, "warmup": warmup,
                "steps": steps, "steps_per_epoch": per_epoch,
                "comparison": compare(Measurement.of(rates["full"]), Measurement.of(rates["synthetic"]), bound=(0, 1),
                                      why="training with a loader does the model's work and more").verdict,
                "verdict": judge(medians["io"], medians["synthetic"], medians["full"])[0]}
    finally:
        setup.loaders.close()


def loader_study(settings: dict[str, dict], warmup: int, steps: int, rounds: int,
                 on_row: Callable[[list[dict]], object] | None = None, **options) -> pd.DataFrame:
    """:func:`steady_state` for every named setting, each a variant of the one runner; a loader that cannot run
    here keeps its reason. ``on_row`` gets the rows so far after each (a benchmark records them the moment they
    exist)."""

    def run(setting: Variant) -> dict:
        try:
            return {**setting.options, **steady_state(warmup, steps, rounds, **{**options, **setting.options})}
        except RuntimeError as error:  # DaliUnavailable and device errors name their reason
            return {**setting.options, "verdict": f"not available: {error}"}

    variants = [Variant(name, **setting) for name, setting in settings.items()]
    return run_variants(variants, run, desc="loader settings", on_row=on_row, column="setting")
