"""The one training loop of the course and its command line, ``python -m course_utils.train``.

Notebooks call :func:`train` with the same arguments as the flags (``--batch-size`` becomes
``batch_size=``), job scripts and benchmarks call the command; both end in :func:`run`. A run
writes ``metrics.jsonl``, ``summary.json``, TensorBoard events and ``checkpoints/last.pt`` under
its ``--out`` folder. Flags left unset take their value from the course size (``--size`` or
``COURSE_SIZE``).
"""

from __future__ import annotations
from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Any

from course_utils import config, distributed, models, preemption
from course_utils.data import DATA_SOURCES, LOADERS
from course_utils.loop import Loop
from course_utils.monitor import BACKEND_NAMES
from course_utils.parallel import PARALLEL_MODES
from course_utils.preemption import Preempted
from course_utils.run_config import AMP_DTYPES, COMPILE_MODES, TrainConfig
from course_utils.step import prepare


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train as ``cfg`` says and return the summary that rank 0 also writes to ``summary.json``."""
    setup = prepare(cfg)
    try:
        loop = Loop(setup)
        try:
            if loop.step >= loop.total_steps:
                raise ValueError(f"{loop.out} holds a finished run ({loop.step} steps): nothing to resume; raise "
                                 "--epochs or --max-steps to train further, or choose another --out")
            for epoch in range(loop.start_epoch, loop.epochs):
                loop.run_epoch(epoch)
        finally:
            loop.close()
        summary = loop.summary()
        loop.writer.summary(summary)
        return summary
    finally:
        setup.loaders.close()
        distributed.teardown()


def train(**options: Any) -> dict[str, Any]:
    """Train from a notebook: ``train(model="resnet18", epochs=2)`` is ``--model resnet18 --epochs 2``."""
    valid = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")
    return run(TrainConfig(**options))


def build_parser() -> argparse.ArgumentParser:
    sizes = ", ".join(f"{name}: {s.model}, {s.epochs} epochs, batch {s.batch_size}"
                      for name, s in config.SIZES.items())
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.train", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Size defaults: {sizes}.")
    add = parser.add_argument
    add("--size", choices=list(config.SIZES), help=f"course size (default: ${config.SIZE_VARIABLE}, "
        "else workshop on a GPU machine and ci elsewhere); fills every flag left unset")
    add("--model", choices=models.MODEL_NAMES, help="network to train (default: from the size)")
    add("--epochs", type=int, help="passes over the training set (default: from the size)")
    add("--max-steps", type=int, help="stop after this many iterations in all, even mid-epoch")
    add("--batch-size", type=int, help="images per iteration and process (default: from the size)")
    add("--lr", type=float, help="peak learning rate of SGD, annealed by a cosine (default: from the size)")
    add("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    add("--weight-decay", type=float, default=5e-4, help="L2 weight decay (default 5e-4)")
    add("--workers", type=int, help="DataLoader worker processes (default: from the size)")
    add("--loader", choices=LOADERS, default="torch",
        help="torch: augment in DataLoader workers (default); dali: an NVIDIA DALI pipeline (GPU operators on "
             "NVIDIA, CPU operators elsewhere); gpu-aug: uint8 batches augmented on the device (the AMD path)")
    add("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
        help="page-locked host batches for faster copies to the GPU (default: on with a GPU)")
    add("--persistent-workers", action="store_true", help="keep DataLoader workers alive between epochs")
    add("--prefetch-factor", type=int, help="batches each worker loads ahead (PyTorch's default: 2)")
    add("--seed", type=int, default=0, help="random seed; a CPU run with the same seed repeats exactly")
    add("--data", choices=DATA_SOURCES, default="cifar100",
        help="cifar100 (default), synthetic random images (no I/O), or an imagefolder with train/ and val/")
    add("--data-dir", help="data root holding cifar-100-python/ (default: from the size and $COURSE_DATA_DIR)")
    add("--no-augment", dest="augment", action="store_false", help="turn off random crop and flip")
    add("--image-size", type=int, choices=(32, 224),
        help="32: native CIFAR with CIFAR-stem ResNets; 224: resized, torchvision's standard ResNets "
             "(the LUMI workshop's set-up)")
    add("--train-samples", type=int, help="use only the first N training images")
    add("--test-samples", type=int, help="use only the first N test images")
    add("--amp", choices=list(AMP_DTYPES), default="off",
        help="mixed precision: autocast to fp16 (with loss scaling) or bf16; off trains in fp32 (default)")
    add("--channels-last", action="store_true", help="NHWC memory layout for model and images (faster convolutions "
        "on tensor cores)")
    add("--fused-optimizer", action="store_true", help="one fused kernel for the whole SGD update")
    add("--compile", choices=COMPILE_MODES, help="torch.compile the model in this mode; reduce-overhead adds "
        "CUDA graphs on GPUs")
    add("--input-delay-ms", type=float, default=0.0,
        help="sleep this long in the loader for every batch, in its workers: an input-bound run on purpose "
             "(torch and gpu-aug loaders; default 0)")
    add("--trace", metavar="DIR", help="profile a few iterations with torch.profiler; write DIR/trace.json "
        "(open it in Perfetto), a TensorBoard trace and operator/phase tables")
    add("--monitor", nargs="?", const="auto", choices=BACKEND_NAMES, metavar="BACKEND",
        help="sample GPU (or CPU) utilization, memory and power during the run into OUT/monitor.csv; "
             f"BACKEND is one of {', '.join(BACKEND_NAMES)} (default auto)")
    add("--monitor-interval", type=float, default=0.5, help="seconds between monitor samples (default 0.5)")
    add("--distributed", choices=PARALLEL_MODES, default="none",
        help="none: one device (default); dp: nn.DataParallel over the visible GPUs in this process; ddp: "
             "DistributedDataParallel, one process per device (start it with torchrun or srun; alone it makes a "
             "group of one)")
    add("--bucket-cap-mb", type=float, default=25.0, help="DDP: size of the gradient buckets all-reduced together "
        "(default 25)")
    add("--gradient-as-bucket-view", action="store_true", help="DDP: gradients live inside the communication "
        "buckets, saving a copy and memory")
    add("--static-graph", action="store_true", help="DDP: the graph is the same every step, so DDP plans its "
        "communication once")
    add("--sync-bn", action="store_true", help="DDP on GPUs: BatchNorm statistics over the global batch "
        "(SyncBatchNorm)")
    add("--grad-accum", type=int, default=1, metavar="N", help="accumulate gradients over N batches per optimizer "
        "step (DDP all-reduces only the last one, under no_sync for the others)")
    add("--warmup-epochs", type=float, default=0.0, help="raise the learning rate linearly from ~0 to --lr over "
        "this many epochs, then anneal (large global batches need it; default 0)")
    add("--dist-timeout", type=float, default=600.0, help="seconds a rank waits for the others before it fails "
        "instead of hanging (default 600)")
    add("--checkpoint-every", type=int, metavar="N", help="also checkpoint every N steps within an epoch (every "
        "epoch's end always is)")
    add("--resume", metavar="auto|PATH", help="continue from a checkpoint: auto takes the newest in --out's "
        "checkpoints/ (starting fresh if there is none), PATH a given file")
    add("--keep-checkpoints", type=int, default=2, metavar="K", help="keep the newest K checkpoints (default 2)")
    add("--out", help="run folder for metrics, TensorBoard and checkpoints (default: runs/<model>-<time>)")
    add("--log-every", type=int, help="write a metrics record every N iterations (default: from the size)")
    add("--device", default="auto", help="auto (first GPU, else CPU), cpu, cuda or cuda:N")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar (batch jobs)")
    return parser


def to_flags(**options: Any) -> list[str]:
    """The command-line flags that mean ``options`` (``batch_size=32, augment=False`` gives
    ``--batch-size 32 --no-augment``): what a notebook passes to torchrun or a job script."""
    actions = {action.dest: action for action in build_parser()._actions if action.option_strings}
    flags: list[str] = []
    for name, value in options.items():
        if name not in actions:
            raise TypeError(f"unknown option {name!r}; valid: {', '.join(sorted(actions))}")
        action = actions[name]
        if isinstance(action, argparse.BooleanOptionalAction):
            flags.append(action.option_strings[0] if value else action.option_strings[1])
        elif action.nargs == 0:  # store_true / store_false: the flag says the non-default value
            if bool(value) != bool(action.default):
                flags.append(action.option_strings[0])
        elif value is not None:
            flags += [action.option_strings[0], str(value)]
    return flags


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run(TrainConfig(**vars(args)))
    except Preempted as stop:
        print(f"preempted: {stop}", file=sys.stderr)
        return preemption.EXIT_CODE
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if distributed.placement().is_main:
        print(f"{summary['images_per_second']:.0f} images/s in steady state, test top-1 "
              f"{summary['test_top1']:.1f} %; results in {summary['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
