"""Write a tiny COCO-format detection set in COCO 2017's layout (the ``ci`` size's data for notebook 10).

    python -m data_prep.tiny_coco --root data/tiny/coco [--train N --val N --seed 0]

What the files hold is in :mod:`course_utils.data.generated_coco`. Output is a pure function of the
arguments.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from course_utils.data.generated_coco import TRAIN_IMAGES, VAL_IMAGES, generate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True,
                        help="folder that receives train2017/, val2017/ and annotations/")
    parser.add_argument("--train", type=int, default=TRAIN_IMAGES, help=f"training images (default {TRAIN_IMAGES})")
    parser.add_argument("--val", type=int, default=VAL_IMAGES, help=f"validation images (default {VAL_IMAGES})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    try:
        folder = generate(args.root, args.train, args.val, args.seed)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote a tiny COCO-format set ({args.train} train / {args.val} val images) to {folder}")


if __name__ == "__main__":
    main()
