"""Model x batch-size sweeps: training speed, peak memory, utilization and power per setting (notebook 02;
notebook 05's progression measures its stages with it).

Each setting trains on one fixed synthetic batch already on the device (no loader, no
evaluation), so that what is measured is the model and the batch alone. A setting that does
not fit in memory is a result, "out of memory", not a crash.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import pandas as pd
import torch
from tqdm.auto import tqdm

from course_utils import devices
from course_utils.observe import flops
from course_utils.observe.clocks import timed_rate
from course_utils.observe.monitor import Monitor, this_process_rows
from course_utils.observe.profiling import NO_RANGES
from course_utils.training import models
from course_utils.training.options import TrainOptions
from course_utils.training.setup import prepare
from course_utils.training.step import next_batch, train_step


def is_out_of_memory(error: BaseException) -> bool:
    """A GPU's OutOfMemoryError, or the CPU allocator refusing a request (a plain RuntimeError)."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def _peak_memory_mib(device: torch.device, frame: pd.DataFrame) -> float | None:
    """The allocator's peak on a GPU; on the CPU, the most resident memory the monitor saw."""
    if device.type == "cuda":
        return devices.peak_memory_mib(device)
    return frame["memory_used_mib"].max() if not frame.empty else None


@functools.cache
def _model_size(model: str, image_size: int) -> tuple[int, float]:
    """Parameters and training GFLOP per image of ``model``: counted once per model, not once per batch size."""
    return (models.count_parameters(models.build(model, image_size=image_size)),
            flops.training_flops_per_image(lambda: models.build(model, image_size=image_size), image_size) / 1e9)


def measure_setting(model: str, batch_size: int, steps: int = 10, warmup: int = 2, image_size: int = 32,
                    monitor_backend: str = "auto", interval: float = 0.2, **train_options) -> dict:
    """Train ``model`` at ``batch_size`` for ``warmup`` + ``steps`` iterations and report on the timed ones.

    ``train_options`` (``amp="bf16"``, ``channels_last=True``, ...) go to the training set-up.
    """
    parameters, gflops = _model_size(model, image_size)
    row = {"model": model, "batch_size": batch_size, "status": "ok", "parameters": parameters,
           "training_gflops_per_image": gflops}
    setup = None
    try:
        setup = prepare(TrainOptions(model=model, batch_size=batch_size, data="synthetic", train_samples=batch_size,
                                    test_samples=batch_size, workers=0, image_size=image_size, progress=False,
                                    **train_options))
        device = setup.device
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        images, labels = next_batch(iter(setup.loaders.train), device, NO_RANGES)

        def step() -> int:
            train_step(setup, [(images, labels)], NO_RANGES)
            return batch_size

        monitor = Monitor(monitor_backend, interval, device)  # sampling starts with the timed steps
        try:
            rate, seconds = timed_rate(step, steps, warmup, device, on_timed_start=monitor.start)
        finally:
            monitor.stop()
        frame = monitor.frame()
        device_rows = this_process_rows(frame)
        row.update(images_per_second=rate, step_ms=1000 * seconds / steps,
                   mfu=flops.mfu(rate, row["training_gflops_per_image"] * 1e9, devices.device_name(device),
                                 train_options.get("amp", "off")),
                   peak_memory_mib=_peak_memory_mib(device, device_rows),
                   utilization_percent=device_rows["utilization_percent"].mean(),
                   power_watts=device_rows["power_watts"].mean(),
                   power_limit_watts=device_rows["power_limit_watts"].max(),
                   power_note=device_rows["power_note"].iloc[0] if len(device_rows) else "")
    except RuntimeError as error:  # torch.OutOfMemoryError is one
        if not is_out_of_memory(error):
            raise
        row["status"] = "out of memory"
    finally:
        setup = None  # release the model and its memory before emptying the cache
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def sweep(model_names: Iterable[str], batch_sizes: Iterable[int], steps: int = 10, **options) -> pd.DataFrame:
    """:func:`measure_setting` for every model and batch size, with a progress bar."""
    settings = [(m, b) for m in model_names for b in batch_sizes]
    rows = [measure_setting(m, b, steps, **options) for m, b in tqdm(settings, desc="sweep", unit="setting")]
    return pd.DataFrame(rows)
