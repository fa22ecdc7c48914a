"""The short deterministic run the sharding tests share (``test_fsdp.py``, ``test_faults_at_scale.py``,
``test_ddp.py``, ``test_memory_forecast.py``): a BatchNorm-free model, no augmentation, no workers, a loss every
step. One FSDP run and one DDP run of it are launched once per session (the ``fsdp_run`` and ``ddp_run``
fixtures); a run that resumes it must repeat these options. One copy of it, its newer
checkpoints damaged each in a way of its own, is resumed once per session (the ``fsdp_resumed_past_damage``
fixture)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

from course_utils.parallel.launch import LaunchResult, launch
from course_utils.run_folder import RunFolder
from course_utils.training import checkpoint
from course_utils.training.options import to_flags


def options(tiny_root: Path, out: Path | str, **extra) -> dict:
    return {"size": "ci", "data_dir": str(tiny_root), "model": "small_cnn_gn", "train_samples": 256,
            "test_samples": 101, "max_steps": 4, "log_every": 1, "workers": 0, "device": "cpu", "seed": 5,
            "augment": False, "progress": False, "out": str(out), "batch_size": 16, **extra}


def launched(ranks: int, tiny_root: Path, out: Path | str, **extra) -> LaunchResult:
    """The training command on ``ranks`` gloo ranks under torchrun, with these options and ``extra``."""
    return launch(ranks, "course_utils.train", *to_flags(**options(tiny_root, out, **extra)),
                  log_dir=Path(out).parent / f"{Path(out).name}-logs", echo=False, timeout_seconds=300)


def unfinished_copy(run: Path, to: Path, stopped_at: int | None = None) -> RunFolder:
    """A copy of the finished ``run`` to resume: without its summary, and with ``stopped_at`` without its sharded
    checkpoints of later steps either, as if it had stopped there."""
    shutil.copytree(run, to)
    folder = RunFolder(to)
    folder.summary.unlink()
    if stopped_at is not None:
        last_kept = checkpoint.step_path(folder.checkpoints, stopped_at, sharded=True).name
        for later in [path for path in folder.checkpoints.glob("step-*.dcp") if path.name > last_kept]:
            shutil.rmtree(later)
    return folder


class WritesAFile:
    """What a forged file would hold: unpickling it runs ``open(path, "w").write(...)``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return exec, (f"open({str(self.path)!r}, 'w').write('this ran')",)


def _missing(shard: Path) -> None:
    shard.unlink()


def _truncated(shard: Path) -> None:
    os.truncate(shard, shard.stat().st_size // 2)


def _corrupted(shard: Path) -> None:
    with open(shard, "r+b") as stream:  # the same length, its first item's header overwritten
        stream.write(bytes(64))


# Each damage to a shard file, by name: the step whose checkpoint holds it in ``resumed_past_damage`` and how it is
# done. A corrupted shard is found only when its items are read, so it lies in the run's own step 4; the others are
# found from the files alone, before anything in them is read, so they lie in copies of it under later steps' names.
SHARD_DAMAGE = {"missing": (8, _missing), "truncated": (6, _truncated), "corrupted": (4, _corrupted)}
FORGED_METADATA_STEP = 10  # its .metadata unpickles to code that writes a file
NO_METADATA_STEP = 12  # its .metadata is missing
HALF_WRITTEN = 14  # a write killed before its rename: the folder under its temporary name


def resumed_past_damage(tiny_root: Path, run: Path, folder: Path) -> tuple[LaunchResult, Path, Path]:
    """A copy of the finished FSDP ``run`` (checkpoints at steps 2 and 4) with every checkpoint newer than step 2
    damaged in one way of its own, as above, resumed on 2 ranks with ``--resume auto`` to step 5: one launch
    passes over each damage, naming its checkpoint, for step 2. Returns what the launch gave, the run folder, and
    the file the forged metadata would write were it ever unpickled."""
    out, ran = folder / "run", folder / "ran"
    checkpoints = unfinished_copy(run, out).checkpoints

    def at(step: int) -> Path:
        return checkpoint.step_path(checkpoints, step, sharded=True)

    for step in [step for step, _ in SHARD_DAMAGE.values()] + [FORGED_METADATA_STEP, NO_METADATA_STEP]:
        if step != 4:
            shutil.copytree(at(4), at(step))  # each copied before any is damaged
    shutil.copytree(at(4), at(HALF_WRITTEN).with_name(f".{at(HALF_WRITTEN).name}.tmp"))
    for step, damage in SHARD_DAMAGE.values():
        damage(at(step) / "__1_0.distcp")
    (at(FORGED_METADATA_STEP) / checkpoint.SHARDED_METADATA).write_bytes(pickle.dumps(WritesAFile(ran)))
    (at(NO_METADATA_STEP) / checkpoint.SHARDED_METADATA).unlink()
    return launched(2, tiny_root, out, distributed="fsdp", max_steps=5, resume="auto"), out, ran
