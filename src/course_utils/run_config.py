"""Every setting of a training run, as one dataclass: the flags of ``python -m course_utils.train``.

``None`` means "from the course size"; :meth:`TrainConfig.resolved` fills those in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

import torch

from course_utils import config

AMP_DTYPES: dict[str, torch.dtype | None] = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


@dataclass
class TrainConfig:
    """Every setting of a run. ``None`` means: take it from the course size."""

    size: str | None = None
    model: str | None = None
    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 5e-4
    workers: int | None = None
    loader: str = "torch"
    pin_memory: bool | None = None
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    seed: int = 0
    data: str = "cifar100"
    data_dir: str | None = None
    augment: bool = True
    image_size: int | None = None
    train_samples: int | None = None
    test_samples: int | None = None
    input_delay_ms: float = 0.0
    out: str | None = None
    log_every: int | None = None
    amp: str = "off"
    channels_last: bool = False
    fused_optimizer: bool = False
    compile: str | None = None
    trace: str | None = None
    monitor: str | None = None
    monitor_interval: float = 0.5
    device: str = "auto"
    progress: bool = True
    distributed: str = "none"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    sync_bn: bool = False
    grad_accum: int = 1
    warmup_epochs: float = 0.0
    dist_timeout: float = 600.0
    checkpoint_every: int | None = None
    resume: str | None = None
    keep_checkpoints: int = 2

    def resolved(self) -> TrainConfig:
        """A copy with every size-dependent ``None`` filled in and the paths made concrete."""
        size = config.get_size(self.size)
        values = asdict(self)
        values["size"] = size.name
        for name in ("model", "epochs", "batch_size", "lr", "workers", "log_every", "image_size"):
            if values[name] is None:
                values[name] = getattr(size, name)
        if self.data == "cifar100":
            for name in ("train_samples", "test_samples"):
                if values[name] is None:
                    values[name] = getattr(size, name)
            values["data_dir"] = str(self.data_dir or config.data_dir(size))
        if values["out"] is None:
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            values["out"] = config.runs_dir() / f"{values['model']}-{stamp}"
        for name in ("out", "data_dir", "trace"):  # paths may come as Path objects from a notebook
            if values[name] is not None:
                values[name] = str(values[name])
        return TrainConfig(**values)
