"""The one training command of the course, ``python -m course_utils.train`` (notebooks 01-08, job scripts).

Notebooks call :func:`train` with the same options as the flags (``--batch-size`` becomes
``batch_size=``); job scripts and benchmarks call the command; both end in :func:`run`. A run
writes ``metrics.jsonl``, ``summary.json``, TensorBoard events and ``checkpoints/last.pt`` under
its ``--out`` folder. Options left unset take their value from the course size (``--size`` or
``COURSE_SIZE``). Every option is a field of :class:`course_utils.training.options.TrainOptions`.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from typing import Any

from course_utils.parallel import process_group
from course_utils.training import preemption
from course_utils.training.evaluate import score_line
from course_utils.training.loop import Loop
from course_utils.training.options import TrainOptions, build_parser
from course_utils.training.preemption import Preempted
from course_utils.training.setup import prepare
from course_utils.training.summary import start_up_line


def run(options: TrainOptions) -> dict[str, Any]:
    """Train as ``options`` say and return the summary that rank 0 also writes to ``summary.json``."""
    with prepare(options) as setup, Loop(setup) as loop:
        return loop.run()


def train(**options: Any) -> dict[str, Any]:
    """Train from a notebook: ``train(model="resnet18", epochs=2)`` is ``--model resnet18 --epochs 2``."""
    return run(TrainOptions.from_keywords(**options))


def describe_error(error: BaseException) -> str:
    """One line for the terminal: what went wrong and how to go on. The course's own errors already say
    it; a full disk and the operating system's errors get the file and the fix."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        where = f" writing {error.filename}" if error.filename else ""
        return (f"disk full{where}: free space there, then run the same command with --resume auto (the same --out): "
                "it continues from the last checkpoint, which is whole (every write is atomic)")
    if isinstance(error, OSError) and error.strerror:
        return error.strerror + (f": {error.filename}" if error.filename else "")
    if isinstance(error, (ValueError, RuntimeError, OSError)):
        return str(error)
    return f"{type(error).__name__}: {error}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser(description=__doc__).parse_args(argv)
    try:
        summary = run(TrainOptions(**vars(args)))
    except Preempted as stop:
        print(f"preempted: {stop}", file=sys.stderr)
        return preemption.EXIT_CODE
    except KeyboardInterrupt:
        print("stopped by a second Ctrl-C, without a checkpoint of the last steps; --resume auto continues from "
              "the last checkpoint", file=sys.stderr)
        return 130
    except (OSError, ValueError, RuntimeError, KeyError, EOFError, subprocess.SubprocessError) as error:
        print(f"error: {describe_error(error)}", file=sys.stderr, flush=True)
        if preemption.received_while_training() != "SIGTERM":  # else torchrun is ending every rank already
            process_group.stop_with_the_others()
        return 1
    if process_group.placement().is_main:
        print(f"{summary['images_per_second']:.0f} images/s in steady state, {score_line(summary)}; "
              f"{start_up_line(summary)}; results in {summary['out']}")
    return 0


if __name__ == "__main__":
    process_group.end_process(main())
