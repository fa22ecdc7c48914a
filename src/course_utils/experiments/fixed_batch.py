"""One training setting timed on one fixed batch already on the device (notebooks 02 and 05, and the sweep, progression
and monitor-cost benchmarks): no loader and no evaluation, so that what is measured is the model, the batch and the
options alone, in rounds whose spread the answers compare with. A setting that does not fit in memory is a result,
"out of memory", not a crash."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import pandas as pd
import torch

from course_utils import devices
from course_utils.observe import flops
from course_utils.observe.clocks import timed_rate
from course_utils.observe.monitor import Monitor, this_process_rows
from course_utils.observe.noise import Measurement
from course_utils.observe.profiling import NO_RANGES
from course_utils.training import models
from course_utils.training.options import TrainOptions
from course_utils.training.setup import prepare
from course_utils.training.step import next_batch, train_step


def is_out_of_memory(error: BaseException) -> bool:
    """A GPU's OutOfMemoryError, or the CPU allocator refusing a request (a plain RuntimeError)."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def _peak_memory(device: torch.device, frame: pd.DataFrame) -> tuple[float | None, str]:
    """The allocator's peak on a GPU; on the CPU, the most resident memory the monitor saw (the whole
    process's, libraries and caches included, so activations hardly show in it)."""
    if device.type == "cuda":
        return devices.peak_memory_mib(device), "allocator"
    return (frame["memory_used_mib"].max() if not frame.empty else None), "process"


@functools.cache
def _model_size(model: str, image_size: int) -> tuple[int, float]:
    """Parameters and training GFLOP per image of ``model``: counted once per model, not once per batch size."""
    return (models.count_parameters(models.build(model, image_size=image_size)),
            flops.training_flops_per_image(lambda: models.build(model, image_size=image_size), image_size) / 1e9)


def fixed_batch_step(setup) -> Callable[[], int]:
    """One training step on one batch already on the device, returning its image count."""
    images, labels = next_batch(iter(setup.loaders.train), setup.device, NO_RANGES, setup.cfg.channels_last)

    def step() -> int:
        train_step(setup, [(images, labels)], NO_RANGES)
        return len(labels)

    return step


def measure_setting(model: str, batch_size: int, steps: int = 10, warmup: int = 2, image_size: int = 32,
                    monitor_backend: str = "auto", interval: float = 0.2, rounds: int = 1,
                    before_round: Callable[[], object] | None = None, **train_options) -> dict:
    """Train ``model`` at ``batch_size`` for ``warmup`` iterations, then ``rounds`` x ``steps`` timed ones;
    report the median round and the rounds' spread. ``before_round``: called before each round, outside its
    timing (another measurement interleaved with these rounds).

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
        step = fixed_batch_step(setup)
        monitor = Monitor(monitor_backend, interval, device)  # sampling starts with the timed steps
        try:
            rates = []
            for number in range(rounds):
                if before_round is not None:
                    before_round()
                rates.append(timed_rate(step, steps, warmup if number == 0 else 0, device,
                                        on_timed_start=monitor.start if number == 0 else None)[0])
        finally:
            monitor.stop()
        device_rows = this_process_rows(monitor.frame())
        rate = statistics.median(rates)
        peak, memory_source = _peak_memory(device, device_rows)
        row.update(images_per_second=rate, spread=Measurement.of(rates).spread, rates=rates,
                   step_ms=1000 * batch_size / rate,
                   mfu=flops.mfu(rate, row["training_gflops_per_image"] * 1e9, devices.device_name(device),
                                 train_options.get("amp", "off"), strict_fp32=not devices.tf32_convolutions()),
                   peak_memory_mib=peak, memory_source=memory_source,
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
