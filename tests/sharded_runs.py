"""The short deterministic run the sharding tests share (``test_fsdp.py``, ``test_faults_at_scale.py``): a
BatchNorm-free model, no augmentation, no workers, a loss every step. One FSDP run of it is launched once per
session (the ``fsdp_run`` fixture); a run that resumes it must repeat these options."""

from __future__ import annotations

from pathlib import Path

from course_utils.parallel.launch import LaunchResult, launch
from course_utils.training.options import to_flags


def options(tiny_root: Path, out: Path | str, **extra) -> dict:
    return {"size": "ci", "data_dir": str(tiny_root), "model": "small_cnn_gn", "train_samples": 256,
            "test_samples": 101, "max_steps": 4, "log_every": 1, "workers": 0, "device": "cpu", "seed": 5,
            "augment": False, "progress": False, "out": str(out), "batch_size": 16, **extra}


def launched(ranks: int, tiny_root: Path, out: Path | str, **extra) -> LaunchResult:
    """The training command on ``ranks`` gloo ranks under torchrun, with these options and ``extra``."""
    return launch(ranks, "course_utils.train", *to_flags(**options(tiny_root, out, **extra)),
                  log_dir=Path(out).parent / f"{Path(out).name}-logs", echo=False, timeout_seconds=300)
