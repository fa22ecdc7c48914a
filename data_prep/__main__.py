"""Prepare the data the active course size needs: ``python -m data_prep [--size ci|workshop] [--coco]``.

``ci`` generates the tiny CIFAR-100 and the tiny COCO-format set (seconds, no network); ``workshop``
downloads the official CIFAR-100 archive (about 160 MB) and, with ``--coco``, COCO 2017 for notebook 10
(about 19 GB). Either way an existing, verified tree is left as it is.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from course_utils import config
from course_utils.data import cifar, generated_cifar100, generated_coco
from course_utils.data import coco as coco_data
from data_prep import cifar100, coco, guard


def verified(root: Path) -> bool:
    """Whether ``root`` holds a whole CIFAR-100 that passes its checksums."""
    try:
        return (root / cifar.FOLDER).is_dir() and not cifar.mismatched_files(root)
    except cifar.DatasetCorruptError:  # a manifest this course did not write: prepare the data again
        return False


@dataclass(frozen=True)
class Preparation:
    """How one data set is checked, described, downloaded (workshop) and generated (ci)."""

    ready: Callable[[Path], bool]
    describe: Callable[[Path], str]
    download: Callable[[list[str]], int]  # the data set's own command line
    generate: Callable[[Path], object]


PREPARATIONS = {
    "cifar100": Preparation(verified, cifar.describe, cifar100.main, generated_cifar100.generate),
    "coco": Preparation(lambda root: not coco_data.problems(root), coco_data.describe, coco.main,
                        generated_coco.generate),
}


def prepare(size: config.Size, dataset: str) -> int:
    """Leave a verified tree as it is; otherwise download (workshop) or generate (ci) it."""
    root, steps = config.data_dir(size, dataset), PREPARATIONS[dataset]
    if steps.ready(root):
        print(f"{steps.describe(root)}: verified, nothing to do")
        return 0
    if not size.generated_data:
        return steps.download(["--root", str(root)])
    steps.generate(root)
    print(f"{steps.describe(root)}: ready")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(config.SIZES), default=None,
                        help=f"course size (default: ${config.SIZE_VARIABLE}, else by GPU presence)")
    parser.add_argument("--coco", action="store_true",
                        help="at the workshop size, also download COCO 2017 for notebook 10 (about 19 GB); "
                             "the ci size always makes its tiny COCO-format set")
    args = parser.parse_args(argv)
    size = config.get_size(args.size)

    def work() -> int:
        status = prepare(size, "cifar100")
        if status == 0 and (size.generated_data or args.coco):
            status = prepare(size, "coco")
        return status

    try:
        root = config.data_dir(size)
    except config.NotAFolder as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return guard.run(work, root, chosen_by=config.DATA_VARIABLE)


if __name__ == "__main__":
    sys.exit(main())
