"""Prepare the data the active course size needs: ``python -m data_prep [--size ci|workshop]``.

``ci`` generates the tiny CIFAR-100 (seconds, no network); ``workshop`` downloads the official
archive (about 160 MB). Either way an existing, verified tree is left as it is.
"""

from __future__ import annotations

import argparse
import sys

from course_utils import config
from course_utils.data.cifar import FOLDER, DatasetCorruptError, describe, mismatched_files
from course_utils.data.generated_cifar100 import generate
from data_prep import cifar100


def verified(root) -> bool:
    """Whether ``root`` holds a whole CIFAR-100 that passes its checksums."""
    try:
        return (root / FOLDER).is_dir() and not mismatched_files(root)
    except DatasetCorruptError:  # a manifest this course did not write: prepare the data again
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(config.SIZES), default=None,
                        help=f"course size (default: ${config.SIZE_VARIABLE}, else by GPU presence)")
    args = parser.parse_args(argv)
    size = config.get_size(args.size)
    root = config.data_dir(size)
    if verified(root):
        print(f"{describe(root)}: verified, nothing to do")
        return 0
    if not size.generated_data:
        return cifar100.main(["--root", str(root)])
    generate(root)
    print(f"{describe(root)}: ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
