"""Write a tiny ImageNet in exactly the official archives' formats, to try ``data_prep.imagenet`` without 150 GB.

    python -m data_prep.tiny_imagenet --archives data/tiny-imagenet-archives
    python -m data_prep.imagenet --archives data/tiny-imagenet-archives --root data/tiny-imagenet \\
        --md5sums data/tiny-imagenet-archives/MD5SUMS

What the archives hold is in :mod:`course_utils.data.generated_imagenet`. Output is a pure function of the arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_utils.data.generated_imagenet import CLASSES, MD5SUMS, generate
from data_prep import generator_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archives", type=Path, required=True, help="folder that receives the three archives")
    parser.add_argument("--classes", type=int, default=4, help=f"classes, 2 to {len(CLASSES)} (default 4)")
    parser.add_argument("--train-per-class", type=int, default=24, help="training images a class (default 24)")
    parser.add_argument("--val-per-class", type=int, default=6, help="validation images a class (default 6)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    return generator_command.write(
        parser, lambda: generate(args.archives, args.classes, args.train_per_class, args.val_per_class, args.seed),
        lambda folder: f"wrote a tiny ImageNet's archives and their {MD5SUMS} to {folder}; extract them with: "
                       f"python -m data_prep.imagenet --archives {folder} --root DIR --md5sums {folder / MD5SUMS}",
        args.archives, "--archives")


if __name__ == "__main__":
    sys.exit(main())
