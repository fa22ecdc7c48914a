"""Write a tiny CIFAR-100 in exactly the official on-disk format (the ``ci`` size's data).

    python -m data_prep.tiny_cifar100 --root data/tiny [--train 5000 --test 1000 --seed 0]

What the files hold, and why they need no checksum file, is in
:mod:`course_utils.data.generated_cifar100`. Output is a pure function of the arguments.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from course_utils.data.generated_cifar100 import generate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="folder that receives cifar-100-python/")
    parser.add_argument("--train", type=int, default=5000, help="training images (default 5000)")
    parser.add_argument("--test", type=int, default=1000, help="test images (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    try:
        folder = generate(args.root, args.train, args.test, args.seed)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote tiny CIFAR-100 ({args.train} train / {args.test} test images) to {folder}")


if __name__ == "__main__":
    main()
