"""Every option of a training run, written once (notebooks 01-09, job scripts, benchmarks).

The fields of :class:`TrainOptions`, with their help text and choices, are the one source of truth:
the command line of ``python -m course_utils.train`` (:func:`build_parser`), the keyword arguments
of the notebooks' ``train(...)`` (:meth:`TrainOptions.from_keywords`) and the flags a notebook
passes to torchrun or a job script (:func:`to_flags`) are all generated from them. A new option is
one new field. ``None`` means "from the course size"; :meth:`TrainOptions.resolved` fills those in.
"""

from __future__ import annotations

import argparse
import functools
import numbers
import typing
from dataclasses import Field, asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from course_utils import config
from course_utils.data.datasets import DATA_SOURCES
from course_utils.data.loaders import LOADERS
from course_utils.observe.monitor import BACKEND_NAMES
from course_utils.parallel.layout import MODES, MODES_HELP, mode_of
from course_utils.parallel.wrappers import DDPOptions
from course_utils.training.detection_models import DETECTION_RECIPES, DETECTOR_NAMES
from course_utils.training.models import MODEL_NAMES, VIT_NAMES

AMP_DTYPES: dict[str, torch.dtype | None] = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
SIZE_DEPENDENT = ("model", "epochs", "batch_size", "lr", "workers", "log_every", "image_size")  # None: the size's


def option(default: Any, help: str, *, choices: typing.Iterable[Any] | None = None, metavar: str | None = None,
           when_given_alone: Any = None, at_least: float | None = None, above: float | None = None) -> Any:
    """A field of :class:`TrainOptions` with what its flag needs: help text, choices, metavar, the
    value of a flag given without one (``--monitor`` alone means ``--monitor auto``), and the
    smallest value that makes sense (``at_least``, or strictly ``above``), checked before any work."""
    return field(default=default, metadata={"help": help, "choices": tuple(choices) if choices else None,
                                            "metavar": metavar, "const": when_given_alone,
                                            "at_least": at_least, "above": above})


@dataclass
class TrainOptions:
    """Every setting of a run. ``None`` means: take it from the course size."""

    size: str | None = option(None, "course size; fills every option left unset (default: $COURSE_SIZE, else "
                              "workshop on a GPU machine and ci elsewhere)", choices=config.SIZES)
    model: str | None = option(None, "network to train (a detector with --data coco)", choices=MODEL_NAMES)
    epochs: int | None = option(None, "passes over the training set", at_least=1)
    max_steps: int | None = option(None, "stop after this many iterations in all, even mid-epoch", at_least=1)
    batch_size: int | None = option(None, "images per iteration and process", at_least=1)
    lr: float | None = option(None, "peak learning rate of SGD, annealed by a cosine", above=0)
    momentum: float = option(0.9, "SGD momentum", at_least=0)
    weight_decay: float = option(5e-4, "L2 weight decay", at_least=0)
    workers: int | None = option(None, "DataLoader worker processes", at_least=0)
    loader: str = option("torch", "torch: augment in DataLoader workers; dali: an NVIDIA DALI pipeline (GPU "
                         "operators on NVIDIA, CPU operators elsewhere); gpu-aug: uint8 batches augmented on the "
                         "device (the AMD path); resident: the whole uint8 data set kept on the device, each batch "
                         "indexed and augmented there (data that fits, as CIFAR-100 does)", choices=LOADERS)
    pin_memory: bool | None = option(None, "page-locked host batches for faster copies to the GPU (default: on "
                                     "with a GPU)")
    persistent_workers: bool = option(True, "keep DataLoader workers alive between epochs (--no-persistent-workers "
                                      "starts them again every epoch, a cost the first batches of each pay)")
    prefetch_factor: int | None = option(None, "batches each worker loads ahead (default: PyTorch's, 2)",
                                         at_least=1)
    seed: int = option(0, "random seed; a CPU run with the same seed repeats exactly")
    data: str = option("cifar100", "cifar100, synthetic random images (no I/O), an imagefolder with train/ and "
                       "val/, or coco: COCO-format boxes for a detector (notebook 10)", choices=DATA_SOURCES)
    data_dir: str | None = option(None, "data root holding cifar-100-python/ (default: from the size and "
                                  "$COURSE_DATA_DIR)", metavar="DIR")
    augment: bool = option(True, "random crop and flip (--no-augment turns them off)")
    image_size: int | None = option(None, "32: native CIFAR with CIFAR-stem ResNets; 224: resized, torchvision's "
                                    "standard ResNets (the LUMI workshop's set-up)", choices=(32, 224))
    train_samples: int | None = option(None, "use only the first N training images", metavar="N",
                                        at_least=1)
    test_samples: int | None = option(None, "use only the first N test images", metavar="N",
                                       at_least=1)
    input_delay_ms: float = option(0.0, "sleep this long in the loader for every batch, in its workers: an "
                                   "input-bound run on purpose (torch and gpu-aug loaders)", at_least=0)
    out: str | None = option(None, "run folder for metrics, TensorBoard and checkpoints (default: a new folder "
                             "runs/<model>-<time>, or <model>-<time>-2... when another run of that second has it)",
                             metavar="DIR")
    log_every: int | None = option(None, "write a metrics record every N iterations", metavar="N",
                                    at_least=1)
    amp: str = option("off", "mixed precision: autocast to fp16 (with loss scaling) or bf16; off trains in fp32",
                      choices=AMP_DTYPES)
    channels_last: bool = option(False, "NHWC memory layout for model and images (faster convolutions on tensor "
                                 "cores)")
    fused_optimizer: bool = option(False, "one fused kernel for the whole SGD update")
    compile: str | None = option(None, "torch.compile the model in this mode; reduce-overhead adds CUDA graphs on "
                                 "GPUs", choices=COMPILE_MODES)
    trace: str | None = option(None, "profile a few iterations with torch.profiler; write DIR/trace.json (open it "
                               "in Perfetto), a TensorBoard trace and operator/phase tables", metavar="DIR")
    monitor: str | None = option(None, "sample GPU (or CPU) utilization, memory and power during the run into "
                                 "OUT/monitor.csv (each further node's into OUT/monitor-nodeN.csv on that node's "
                                 "disk); --monitor alone picks the backend itself",
                                 choices=BACKEND_NAMES, metavar="BACKEND", when_given_alone="auto")
    monitor_interval: float = option(0.5, "seconds between monitor samples", above=0)
    device: str = option("auto", "auto (first GPU, else CPU), cpu, cuda or cuda:N")
    progress: bool = option(True, "a progress bar (--no-progress for batch jobs)")
    distributed: str = option("none", MODES_HELP, choices=MODES)
    tp_size: int | None = option(None, "tensor parallel: processes that split each layer (default: all of them "
                                 "with tp, 2 with fsdp-tp)", metavar="N", at_least=2)
    activation_checkpointing: bool = option(False, "keep only each block's input for the backward pass and "
                                            "recompute the block there: less memory, more compute")
    offload: bool = option(False, "FSDP on GPUs: keep the parameter shards and optimizer state in host memory")
    bucket_cap_mb: float = option(25.0, "DDP: size of the gradient buckets all-reduced together",
                                 above=0)
    gradient_as_bucket_view: bool = option(False, "DDP: gradients live inside the communication buckets, saving "
                                           "a copy and memory")
    static_graph: bool = option(False, "DDP: the graph is the same every step, so DDP plans its communication once")
    sync_bn: bool = option(False, "DDP on GPUs: BatchNorm statistics over the global batch (SyncBatchNorm)")
    grad_accum: int = option(1, "accumulate gradients over N batches per optimizer step (DDP all-reduces only the "
                             "last one, under no_sync for the others)", metavar="N", at_least=1)
    warmup_epochs: float = option(0.0, "raise the learning rate linearly from ~0 to --lr over this many epochs, "
                                  "then anneal (large global batches need it)", at_least=0)
    warmup_steps: int | None = option(None, "the same warm-up over this many iterations instead of epochs (Detectron2 "
                                      "warms a detector up over its first 1,000)", metavar="N", at_least=1)
    dist_timeout: float = option(600.0, "seconds a rank waits for the others before it fails instead of hanging",
                                above=0)
    checkpoint_every: int | None = option(None, "also checkpoint every N steps within an epoch (every epoch's end "
                                          "always is)", metavar="N", at_least=1)
    resume: str | None = option(None, "continue from a checkpoint: auto takes the newest in --out's checkpoints/ "
                                "(starting fresh if there is none), PATH a given file or a sharded checkpoint's "
                                ".dcp folder", metavar="auto|PATH")
    crash_at_step: int | None = option(None, "fault drill (notebook 12): the last rank kills itself with SIGKILL once "
                                       "step N is trained and logged, as the out-of-memory killer would; on the "
                                       "job's first attempt only, so that torchrun's restart runs on",
                                       metavar="N", at_least=1)
    keep_checkpoints: int = option(2, "keep the newest K checkpoints", metavar="K", at_least=1)
    overwrite: bool = option(False, "start a new run in an --out whose run did not finish (preempted, stopped or "
                             "crashed), deleting its checkpoints; without it such a run refuses to start there")

    @classmethod
    def from_keywords(cls, **options: Any) -> TrainOptions:
        """The options a notebook passes as keywords (``batch_size=32``), with the valid names on a typo."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")
        return cls(**options)

    def resolved(self) -> TrainOptions:
        """A copy with every size-dependent ``None`` filled in and the paths made concrete."""
        size = config.get_size(self.size)
        values = asdict(self)
        values["size"] = size.name
        if self.data == "coco":  # a detection run: the size's detector and its recipe
            recipe = DETECTION_RECIPES[size.name]
            for name, default in (("model", recipe.model), ("batch_size", recipe.batch_size), ("lr", recipe.lr),
                                  ("epochs", recipe.epochs)):
                values[name] = default if values[name] is None else values[name]
            values["data_dir"] = str(self.data_dir or config.data_dir(size, "coco"))
        for name in SIZE_DEPENDENT:
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
        resolved = TrainOptions(**values)
        resolved.check()
        return resolved

    def check(self) -> None:
        """Refuse values that make no sense before any work is done, naming every one of them."""
        mistyped = [misfit for spec in fields(self) if (misfit := _type_misfit(spec, getattr(self, spec.name)))]
        if mistyped:
            raise TypeError("; ".join(mistyped))
        wrong = []
        for spec in fields(self):
            value, low, above = getattr(self, spec.name), spec.metadata["at_least"], spec.metadata["above"]
            if value is None or isinstance(value, bool):
                continue
            if low is not None and value < low:
                wrong.append(f"{_flag(spec.name)} must be at least {low}, not {value}")
            if above is not None and value <= above:
                wrong.append(f"{_flag(spec.name)} must be above {above}, not {value}")
        wrong += self._task_misfits() + self._folder_misfits()
        if wrong:
            raise ValueError("; ".join(wrong))

    def _folder_misfits(self) -> list[str]:
        """A folder option (``--out``, ``--data-dir``, ``--trace``) naming a file, or a path under one."""
        folders = [spec.name for spec in fields(self) if spec.metadata["metavar"] == "DIR"]
        found = (config.folder_misfit(Path(getattr(self, name)), f"choose another {_flag(name)}")
                 for name in folders if getattr(self, name) is not None)
        return [misfit for misfit in found if misfit]

    @property
    def detection(self) -> bool:
        """Whether this run trains a detector (COCO-format data) rather than a classifier."""
        return self.data == "coco"

    def _task_misfits(self) -> list[str]:
        """A detector on images without boxes, a classifier on boxes, and what detection does not support."""
        if self.model is None:
            return []
        if self.detection and self.model not in DETECTOR_NAMES:
            return [f"--data coco trains a detector: choose --model from {', '.join(DETECTOR_NAMES)}"]
        if not self.detection and self.model in DETECTOR_NAMES:
            return [f"--model {self.model} is a detector: train it on --data coco"]
        mode = mode_of(self.distributed)
        if mode.splits_layers and self.model not in VIT_NAMES:
            return [f"--distributed {self.distributed} splits a vision transformer's attention and MLP layers; "
                    f"--model {self.model} has none: choose --model from {', '.join(VIT_NAMES)}, or use "
                    "--distributed ddp or fsdp"]
        if not self.detection:
            return []
        unsupported = {"loader": self.loader != "torch", "channels_last": self.channels_last,
                       "distributed": mode.sharded or mode.all_gpus_in_one_process}
        return [f"--{name.replace('_', '-')} {getattr(self, name)} is not supported with --data coco "
                f"(detection uses the torch loader, NCHW images, and one device or DDP)"
                for name, wrong in unsupported.items() if wrong]


DDP_KNOBS = tuple(knob.name for knob in fields(DDPOptions))  # each is also a training option


def check_parallel_options(cfg: TrainOptions, device: torch.device) -> None:
    """Refuse options that do not fit the way the model is distributed, naming the fix. (Whether the ranks at
    hand can form the layout is :class:`~course_utils.parallel.layout.Layout`'s own check.)"""
    mode = mode_of(cfg.distributed)
    changed = [_flag(name) for name in DDP_KNOBS
               if getattr(cfg, name) != TrainOptions.__dataclass_fields__[name].default]
    if changed and not mode.ddp:
        raise ValueError(f"{', '.join(changed)} tune DistributedDataParallel; --distributed is {cfg.distributed}"
                         f"{' (FSDP communicates block by block)' if mode.fsdp_over_all_ranks else ''}: "
                         "drop them or use --distributed ddp")
    if mode.splits_layers and (cfg.activation_checkpointing or cfg.compile):
        raise ValueError(f"--distributed {cfg.distributed} is tested without --activation-checkpointing and "
                         "--compile in this course; drop them, or use --distributed fsdp")
    if cfg.offload and not mode.fsdp_over_all_ranks:
        raise ValueError("--offload keeps FSDP's shards and optimizer state in host memory: use it with "
                         "--distributed fsdp")
    if cfg.offload and device.type != "cuda":
        raise ValueError("--offload moves FSDP's shards from GPU memory to host memory: it needs GPUs (on the CPU "
                         "everything is in host memory already); leave it off")
    if cfg.offload and cfg.compile:
        raise ValueError("--offload with --compile: torch.compile cannot trace FSDP's copies between host and GPU; "
                         "drop one of them")
    if mode.fsdp and cfg.channels_last:
        raise ValueError("--channels-last with --distributed fsdp: FSDP keeps each parameter as one contiguous "
                         "tensor to shard it, and channels_last stores convolution weights in another order; drop "
                         "--channels-last, or use --distributed ddp")
    if mode.sharded and cfg.fused_optimizer:
        raise ValueError(f"--fused-optimizer with --distributed {cfg.distributed}: PyTorch's fused SGD kernel does "
                         "not take sharded parameters (DTensors); drop --fused-optimizer")
    if mode.all_gpus_in_one_process and cfg.activation_checkpointing:
        raise ValueError("--activation-checkpointing with --distributed dp: DataParallel copies every block to "
                         "each GPU, and the copies would recompute with GPU 0's weights; use --distributed ddp")
    if cfg.sync_bn and device.type != "cuda":
        raise ValueError("--sync-bn needs GPUs: SyncBatchNorm runs on CUDA/ROCm devices only; leave it off on CPU")


@functools.cache
def _type_hints() -> dict[str, Any]:
    return typing.get_type_hints(TrainOptions)  # resolved once, not once per field and call


def _value_type(spec: Field) -> type:
    """``int`` for ``int | None``, and so on: the type a flag's text is parsed as."""
    hint = _type_hints()[spec.name]
    kinds = [kind for kind in typing.get_args(hint) or (hint,) if kind is not type(None)]
    return kinds[0]


NUMBERS = {int: (numbers.Integral, "a whole number (an int)"), float: (numbers.Real, "a number (an int or a float)")}


def number_misfit(name: str, value: Any, kind: type) -> str | None:
    """What is wrong with ``value`` given as ``name``, which takes a ``kind`` (int or float): ``batch_size="8"``
    from a notebook, which a flag's text never is (the parser converts it); None when it fits."""
    accepted, what = NUMBERS[kind]
    if isinstance(value, accepted) and not isinstance(value, bool):
        return None
    return f"{name} takes {what}, not {value!r} (a {type(value).__name__})"


def _type_misfit(spec: Field, value: Any) -> str | None:
    kind = _value_type(spec)
    return None if value is None or kind not in NUMBERS else number_misfit(spec.name, value, kind)


def _flag(name: str, negated: bool = False) -> str:
    """``batch_size`` -> ``--batch-size``; negated, ``augment`` -> ``--no-augment``."""
    return ("--no-" if negated else "--") + name.replace("_", "-")


def _help(spec: Field) -> str:
    text = spec.metadata["help"]
    if spec.name in SIZE_DEPENDENT:
        return f"{text} (default: from the size)"
    if spec.default is None or isinstance(spec.default, bool) or "default" in text:
        return text
    return f"{text} (default: {spec.default})"


def build_parser(prog: str = "python -m course_utils.train", description: str | None = None
                 ) -> argparse.ArgumentParser:
    """The command line of the training command, one flag per field of :class:`TrainOptions`."""
    sizes = ", ".join(f"{name}: {s.model}, {s.epochs} epochs, batch {s.batch_size}" for name, s in config.SIZES.items())
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=f"Size defaults: {sizes}.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for spec in fields(TrainOptions):
        meta, kind, flag = spec.metadata, _value_type(spec), _flag(spec.name)
        if kind is bool and spec.default is None:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=_help(spec))
        elif kind is bool:
            action = "store_false" if spec.default else "store_true"
            parser.add_argument(_flag(spec.name, negated=True) if spec.default else flag, dest=spec.name,
                                action=action, help=_help(spec))
        else:
            extra = {"nargs": "?", "const": meta["const"]} if meta["const"] is not None else {}
            parser.add_argument(flag, type=kind, default=spec.default, choices=meta["choices"],
                                metavar=meta["metavar"], help=_help(spec), **extra)
    return parser


def from_flags(argv: list[str] | None = None) -> TrainOptions:
    """The options that command-line flags mean."""
    return TrainOptions(**vars(build_parser().parse_args(argv)))


def to_flags(**options: Any) -> list[str]:
    """The command-line flags that mean ``options`` (``batch_size=32, augment=False`` gives
    ``--batch-size 32 --no-augment``): what a notebook passes to torchrun or a job script."""
    specs = {spec.name: spec for spec in fields(TrainOptions)}
    flags: list[str] = []
    for name, value in options.items():
        if name not in specs:
            raise TypeError(f"unknown option {name!r}; valid: {', '.join(sorted(specs))}")
        spec = specs[name]
        if _value_type(spec) is bool:
            if value is not None and (spec.default is None or bool(value) != spec.default):
                flags.append(_flag(name, negated=not value))
        elif value is not None:
            flags += [_flag(name), str(value)]
    return flags


def changed_options(argv: list[str]) -> dict[str, Any]:
    """Only the options that ``argv`` sets to something other than their default."""
    defaults = TrainOptions()
    return {name: value for name, value in asdict(from_flags(argv)).items() if value != getattr(defaults, name)}

