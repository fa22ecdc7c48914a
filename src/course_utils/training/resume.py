"""Resuming a run exactly where it stopped: what a checkpoint holds besides the weights (notebooks 07-09).

For a CPU run to continue bit for bit, the resumed process must see the same numbers the
uninterrupted one would have: the optimizer's momentum, the scheduler's position, every random
generator (Python, NumPy, torch, CUDA; the DataLoader's, which seeds its workers; gpu-aug's),
and the position in the epoch's sample order. The order itself needs no storing: it comes from
the seed and the epoch (see :func:`course_utils.data.loaders.shard_sampler`), so the resumed run
replays the epoch's first batches through the loader without training on them, and its workers
draw the same augmentations.

A run may continue on another number of ranks when its global batch stays the same (say 2 ranks of
16 images continued by 4 ranks of 8): every step then trains on the same images as before, since
the ranks' shares of the sample order interleave. The random augmentations are drawn anew.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course_utils.parallel.collectives import any_rank, gather, mean_over_ranks
from course_utils.parallel.layout import Layout, mode_of
from course_utils.parallel.sharding import local_tensor
from course_utils.run_folder import LAST_CHECKPOINT, RunFolder
from course_utils.training import checkpoint, sharded_checkpoint
from course_utils.training.setup import Setup

# Settings that must match for the sample order, the step count and the optimization to continue where they
# stopped (the restored optimizer keeps its own learning rate, momentum and weight decay), besides the global
# batch. Longer training (--epochs, --max-steps) and how fast it runs (workers, layout, compile) may change.
SAME_TRAINING = ("model", "image_size", "seed", "train_samples", "data", "loader",
                 "lr", "momentum", "weight_decay", "warmup_epochs", "warmup_steps", "amp", "augment")


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the message names the step."""


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


# What the training command writes in a checkpoint besides the model and optimizer (which a sharded one keeps in
# its shards), by the type each must have; a file without them loads but cannot be resumed.
RUN_STATE = {"scheduler": dict, "scaler": dict, "config": dict, "ranks": list, "world_size": int, "step": int,
             "epoch": int, "epoch_step": int, "epoch_loss_sum": (int, float)}
WHOLE_MODEL_STATE = {"model": dict, "optimizer": dict}
KINDS = {dict: "dictionary", list: "list", int: "whole number", (int, float): "number"}
SAVED_CONFIG = ("distributed", "batch_size", "grad_accum")  # what a resume reads of the saved configuration
SAVED_RANK = ("rng", "loader", "augment")  # what each rank's entry holds


def check_run_state(path: Path, state: dict[str, Any]) -> None:
    """Refuse, as :class:`checkpoint.DamagedCheckpoint`, a file that loads but lacks what a resume reads."""
    expected = RUN_STATE if Path(path).is_dir() else {**WHOLE_MODEL_STATE, **RUN_STATE}
    wrong = [f"no {name}" if name not in state else f"its {name} is not a {KINDS[kind]}"
             for name, kind in expected.items() if not isinstance(state.get(name), kind)]
    if not wrong:
        wrong += [f"its config has no {name}" for name in SAVED_CONFIG if name not in state["config"]]
        wrong += [f"a negative {name}" for name in ("step", "epoch", "epoch_step") if state[name] < 0]
        if len(state["ranks"]) != state["world_size"]:
            wrong.append(f"its ranks list holds {len(state['ranks'])} entries for a world size of "
                         f"{state['world_size']}")
        elif not all(isinstance(rank, dict) and all(name in rank for name in SAVED_RANK) for rank in state["ranks"]):
            wrong.append(f"an entry of its ranks list lacks {', '.join(SAVED_RANK)}")
    if wrong:
        raise checkpoint.DamagedCheckpoint(
            f"{path} loads but is not a whole checkpoint of this course's training command ({'; '.join(wrong)}): "
            "written by another program or changed by hand; resume from another checkpoint (--resume auto passes "
            "over it), or start anew with --overwrite")


def _load(path: Path) -> dict[str, Any]:
    state = checkpoint.load(path)
    check_run_state(path, state)
    return state


def find(resume: str, checkpoint_dir: Path, passed_over: dict[Path, str] | None = None,
         ) -> tuple[Path, dict[str, Any], list[str]] | None:
    """The checkpoint ``--resume`` names, loaded: ``auto`` is the newest whole one in this run's folder
    (None if there is none yet: the run starts from scratch), anything else a checkpoint file (or a sharded
    checkpoint's folder) that must exist and load. Also says which newer checkpoints ``auto`` skipped, and why;
    ``passed_over`` are those found damaged later (sharded ones whose shards did not load), with the reason.

    Loaded into host memory on every device: the generators' states must be CPU byte tensors, and
    ``load_state_dict`` copies weights and optimizer state to where the parameters are."""
    if resume != "auto":
        path = Path(resume)
        if not path.exists():
            raise FileNotFoundError(f"--resume {resume}: no such checkpoint; use --resume auto to continue the run "
                                    f"in --out, or give a file such as {Path(checkpoint_dir) / LAST_CHECKPOINT}")
        return path, _load(path), []
    passed_over = passed_over or {}
    skipped = []
    for path in checkpoint.candidates(checkpoint_dir):
        if path in passed_over:
            skipped.append(passed_over[path])
            continue
        try:
            return path, _load(path), skipped
        except checkpoint.DamagedCheckpoint as error:
            skipped.append(str(error))
    if skipped:
        raise checkpoint.DamagedCheckpoint(f"no checkpoint in {checkpoint_dir} loads ({'; '.join(skipped)}); "
                                           "train from the beginning with another --out")
    return None


def _global_batch(config: dict[str, Any], world_size: int) -> int:
    """Images per optimizer step over all ranks; the ranks of a tensor-parallel group read the same ones."""
    layout = Layout(config["distributed"], config.get("tp_size"), world_size)
    return config["batch_size"] * config["grad_accum"] * layout.data_ranks


def _global_batch_text(config: dict[str, Any], world_size: int) -> str:
    tp = Layout(config["distributed"], config.get("tp_size"), world_size).tensor_parallel
    groups = f"{world_size} rank(s) in groups of {tp}" if tp > 1 else f"{world_size} rank(s)"
    return (f"{groups} x {config['batch_size']} images x {config['grad_accum']} micro-batch(es) = "
            f"{_global_batch(config, world_size)}")


def check_same_training(saved: dict[str, Any], current: dict[str, Any], world_size: int, saved_world: int,
                        path: Path) -> None:
    """Refuse a checkpoint of another training, naming the setting that differs."""
    different = [f"{name}: {saved.get(name)!r} in the checkpoint, {current.get(name)!r} now"
                 for name in SAME_TRAINING if saved.get(name) != current.get(name)]
    if _global_batch(saved, saved_world) != _global_batch(current, world_size):
        different.append(f"global batch: {_global_batch_text(saved, saved_world)} in the checkpoint, "
                         f"{_global_batch_text(current, world_size)} now")
    if different:
        raise ValueError(f"{path} is a checkpoint of another training ({'; '.join(different)}); resume with the "
                         f"same settings, or start a new run with a different --out")


def check_same_layout(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    """Refuse a whole-model checkpoint in a sharded run (FSDP, tensor parallel), and a sharded one in any other."""
    sharded, wanted = Path(path).is_dir(), mode_of(current["distributed"]).sharded
    if sharded == wanted:
        return
    kinds = {True: "a folder of shards", False: "one file with the whole model"}
    raise ValueError(f"{path} is {kinds[sharded]}, written by a --distributed {saved['distributed']} run; this run "
                     f"is --distributed {current['distributed']}, which resumes from {kinds[wanted]}: resume with "
                     f"--distributed {saved['distributed']}, or start a new run with another --out")


@dataclass
class Position:
    """Where a run stands: steps done in all, the epoch it is in, steps into that epoch, and the sum
    of that epoch's step losses so far (kept on the device: reading it would wait for the GPU)."""

    step: int
    epoch: int
    epoch_step: int
    epoch_loss_sum: torch.Tensor

    @classmethod
    def start(cls, device: torch.device) -> Position:
        return cls(0, 0, 0, torch.zeros((), device=device))

    def advance(self, loss: torch.Tensor) -> None:
        self.step += 1
        self.epoch_step += 1
        self.epoch_loss_sum += loss

    def next_epoch(self) -> None:
        self.epoch, self.epoch_step = self.epoch + 1, 0
        self.epoch_loss_sum = torch.zeros_like(self.epoch_loss_sum)


class RunState:
    """Saves a run's whole state at a :class:`Position` and restores it, every rank's generators included.

    Rank 0 writes the checkpoint; every rank contributes its generators and reads its own back.
    """

    def __init__(self, setup: Setup, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        self.setup, self.scheduler = setup, scheduler
        self.folder = RunFolder(setup.cfg.out)
        self.resumed_from: str | None = None
        self.skipped: list[str] = []  # why ``--resume auto`` passed over newer checkpoints
        self.resharded_from: int | None = None  # the number of ranks that wrote the checkpoint, when not this one
        self._restore: dict[str, Any] | None = None  # this rank's generators, until the first epoch uses them
        self._epoch_start_loader: torch.Tensor | None = None  # the loader's generator before this epoch's iter()

    def resume(self, option: str) -> Position | None:
        """Load the checkpoint ``--resume`` names into model, optimizer, scheduler and scaler; its position,
        or None when ``auto`` finds no checkpoint yet."""
        setup = self.setup
        passed_over: dict[Path, str] = {}
        while True:  # until a checkpoint loads whole: a sharded one shows damage inside its shards only here
            found = find(option, self.folder.checkpoints, passed_over)
            if found is None:
                return None
            path, state, self.skipped = found
            current = asdict(setup.cfg)
            check_same_layout(state["config"], current, path)
            check_same_training(state["config"], current, setup.where.world_size, state["world_size"], path)
            if not path.is_dir():
                setup.model.load_state_dict(state["model"])
                setup.optimizer.load_state_dict(state["optimizer"])
                break
            try:  # every rank fails together: DCP gathers every rank's failures
                sharded_checkpoint.load_model_and_optimizer(path, setup.model, setup.optimizer)
                break
            except checkpoint.DamagedCheckpoint as error:
                if option != "auto":
                    raise
                passed_over[path] = str(error)
        self.scheduler.load_state_dict(state["scheduler"])
        setup.scaler.load_state_dict(state["scaler"])
        self.resharded_from = state["world_size"] if state["world_size"] != setup.where.world_size else None
        # On another number of ranks the generators of the old ranks do not fit the new ones: drawn anew.
        self._restore = None if self.resharded_from else state["ranks"][setup.where.rank]
        self.resumed_from = str(path)
        return Position(state["step"], state["epoch"], state["epoch_step"],
                        torch.full((), state["epoch_loss_sum"], device=setup.device))

    def epoch_batches(self, position: Position) -> Iterator:
        """The epoch's batches from ``position``'s place in them: after a resume, the checkpoint's (an epoch
        left unfinished ends the run, so any other epoch starts at its beginning)."""
        loaders, restore = self.setup.loaders, self._restore
        if restore is not None and restore["loader"] is not None:
            loaders.order_generator.set_state(restore["loader"])
        self._epoch_start_loader = generator_state(loaders.order_generator)
        batches = iter(loaders.train)
        # Replay the batches trained before the checkpoint: same order, same augmentations.
        for _ in range(position.epoch_step * self.setup.cfg.grad_accum):
            next(batches)
        if restore is not None:
            set_rng_state(restore["rng"])
            if restore["augment"] is not None:
                loaders.augment_generator.set_state(restore["augment"])
            self._restore = None
        return batches

    def save(self, position: Position, keep: int) -> None:
        """A checkpoint from which :meth:`resume` continues exactly; never one of a diverged run."""
        setup = self.setup
        loss = mean_over_ranks(position.epoch_loss_sum.detach().clone()).item()
        check_finite(loss, setup, position, weights=True)
        ranks = gather({
            "rng": rng_state(),
            # Mid-epoch: the state before this epoch's iter(); at an epoch's start: the state now.
            "loader": self._epoch_start_loader if position.epoch_step else generator_state(
                setup.loaders.order_generator),
            "augment": generator_state(setup.loaders.augment_generator)})
        extra = {"scheduler": self.scheduler.state_dict(), "scaler": setup.scaler.state_dict(),
                 "epoch": position.epoch, "epoch_step": position.epoch_step, "step": position.step,
                 "epoch_loss_sum": position.epoch_loss_sum.item(), "world_size": setup.where.world_size,
                 "config": asdict(setup.cfg), "ranks": ranks}
        if setup.layout.sharded:  # every rank writes its shards
            sharded_checkpoint.save_keeping(setup.model, setup.optimizer, extra, self.folder.checkpoints,
                                            position.step, keep, setup.where.is_main)
        elif setup.where.is_main:
            checkpoint.save_keeping({"model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
                                     **extra}, self.folder.checkpoints, position.step, keep)


def check_finite(loss: float, setup: Setup, position: Position, weights: bool = False) -> None:
    """Stop with :class:`NonFiniteLossError` when the loss (and, before a checkpoint, the weights) are no
    longer finite: a diverged run never replaces a good checkpoint."""
    weights_finite = not weights or not any_rank(not all(
        torch.isfinite(local_tensor(value)).all() for value in setup.model.state_dict().values()
        if value.is_floating_point()), setup.device)  # under FSDP each rank checks its own shards
    if math.isfinite(loss) and weights_finite:
        return
    what = f"the training loss became {loss}" if not math.isfinite(loss) else "the weights became inf or nan"
    raise NonFiniteLossError(f"{what} by step {position.step} (epoch {position.epoch + 1}); lower --lr (now "
                             f"{setup.cfg.lr}) and check the data; the last good checkpoint is kept")
