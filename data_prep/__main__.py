"""Prepare the data the active course size needs: ``python -m data_prep [--size ci|workshop] [--coco]``.

``ci`` generates the tiny CIFAR-100 and the tiny COCO-format set (seconds, no network); ``workshop``
downloads the official CIFAR-100 archive (about 160 MB) and, with ``--coco``, COCO 2017 for notebook 10
(about 19 GB). Either way an existing, verified tree is left as it is.
"""

from __future__ import annotations

import argparse
import sys

from course_utils import config
from course_utils.data import coco as coco_data
from course_utils.data import generated_coco
from course_utils.data.cifar import FOLDER, DatasetCorruptError, describe, mismatched_files
from course_utils.data.generated_cifar100 import generate
from data_prep import cifar100, coco


def verified(root) -> bool:
    """Whether ``root`` holds a whole CIFAR-100 that passes its checksums."""
    try:
        return (root / FOLDER).is_dir() and not mismatched_files(root)
    except DatasetCorruptError:  # a manifest this course did not write: prepare the data again
        return False


def prepare_cifar100(size: config.Size) -> int:
    root = config.data_dir(size)
    if verified(root):
        print(f"{describe(root)}: verified, nothing to do")
        return 0
    if not size.generated_data:
        return cifar100.main(["--root", str(root)])
    generate(root)
    print(f"{describe(root)}: ready")
    return 0


def prepare_coco(size: config.Size) -> int:
    root = config.data_dir(size, "coco")
    if not coco_data.problems(root):
        print(f"{coco_data.describe(root)}: verified, nothing to do")
        return 0
    if not size.generated_data:
        return coco.main(["--root", str(root)])
    generated_coco.generate(root)
    print(f"{coco_data.describe(root)}: ready")
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
    status = prepare_cifar100(size)
    if status == 0 and (size.generated_data or args.coco):
        status = prepare_coco(size)
    return status


if __name__ == "__main__":
    sys.exit(main())
