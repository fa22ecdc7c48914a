"""Notebook 02's experiment and its benchmark: the model x batch-size sweep (training speed, peak memory, utilization
and power per setting), sized by the course size; each setting is timed by
:func:`course_utils.experiments.fixed_batch.measure_setting`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from course_utils import config
from course_utils.experiments.fixed_batch import measure_setting
from course_utils.experiments.runs import Variant, run_variants


@dataclass(frozen=True)
class SweepSize:
    """What the sweep measures at a course size."""

    models: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    image_size: int  # workshop: 224 px, so that the LUMI workshop's set-up (ResNet-152, batch 128) is a row
    steps: int  # timed iterations of each round (ci: 2, a ResNet-18 step on a 2-core CPU takes seconds)
    rounds: int = 3  # rounds per setting: their spread is the noise the answers compare with


SWEEPS = {
    "ci": SweepSize(models=("small_cnn", "resnet18"), batch_sizes=(16, 64), image_size=32, steps=2),
    "workshop": SweepSize(models=("resnet18", "resnet50", "resnet152"), batch_sizes=(32, 128, 512, 2048),
                          image_size=224, steps=10),
}


def sweep_size(size: str | None = None) -> SweepSize:
    """The sweep of the active course size (or of ``size``)."""
    return SWEEPS[config.get_size(size).name]


def sweep(model_names: Iterable[str], batch_sizes: Iterable[int], steps: int = 10, rounds: int = 3,
          **options) -> pd.DataFrame:
    """:func:`measure_setting` for every model and batch size, each a variant of the one runner."""
    settings = [Variant(f"{model}, batch {batch}", model=model, batch_size=batch)
                for model in model_names for batch in batch_sizes]

    def run(setting: Variant) -> dict:
        return measure_setting(setting.options["model"], setting.options["batch_size"], steps, rounds=rounds,
                               **options)

    return run_variants(settings, run, desc="sweep").drop(columns="variant")
