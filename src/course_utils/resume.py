"""Resuming a run exactly where it stopped: what a checkpoint holds besides the weights.

For a CPU run to continue bit for bit, the resumed process must see the same numbers the
uninterrupted one would have: the optimizer's momentum, the scheduler's position, every random
generator (Python, NumPy, torch, CUDA; the DataLoader's, which seeds its workers; gpu-aug's),
and the position in the epoch's sample order. The order itself needs no storing: it comes from
the seed and the epoch (see :func:`course_utils.data.shard_sampler`), so the resumed run replays
the epoch's first batches through the loader without training on them, and its workers draw
the same augmentations.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course_utils import checkpoint

# Settings that must match for the sample order and the step count to continue where they stopped.
SAME_TRAINING = ("model", "image_size", "batch_size", "grad_accum", "seed", "train_samples", "data", "loader")


def rng_state() -> dict[str, Any]:
    """Every global random generator of this process, in a form ``weights_only`` loading accepts."""
    _, keys, position, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": position,
                      "has_gauss": has_gauss, "cached": cached},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def generator_state(generator: torch.Generator | None) -> torch.Tensor | None:
    return generator.get_state() if generator is not None else None


def find(resume: str, checkpoint_dir: Path) -> Path | None:
    """The checkpoint ``--resume`` names: ``auto`` is the newest in this run's folder (None if there
    is none yet: the run starts from scratch), anything else a file that must exist."""
    if resume == "auto":
        return checkpoint.latest(checkpoint_dir)
    path = Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint; use --resume auto to continue the run "
                                f"in --out, or give a file such as {Path(checkpoint_dir) / checkpoint.LAST}")
    return path


def check_same_training(saved: dict[str, Any], current: dict[str, Any], world_size: int, saved_world: int,
                        path: Path) -> None:
    """Refuse a checkpoint of another training, naming the setting that differs."""
    different = [f"{name}: {saved.get(name)!r} in the checkpoint, {current.get(name)!r} now"
                 for name in SAME_TRAINING if saved.get(name) != current.get(name)]
    if saved_world != world_size:
        different.append(f"ranks: {saved_world} in the checkpoint, {world_size} now")
    if different:
        raise ValueError(f"{path} is a checkpoint of another training ({'; '.join(different)}); resume with the "
                         f"same settings, or start a new run with a different --out")
