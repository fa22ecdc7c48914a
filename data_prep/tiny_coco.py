"""Write a tiny COCO-format detection set in COCO 2017's layout (the ``ci`` size's data for notebook 10).

    python -m data_prep.tiny_coco --root data/tiny/coco [--train N --val N --seed 0] [--photo-sizes]

``--photo-sizes`` draws the images at COCO's own sizes (the full-size stand-in a detector is timed on).

What the files hold is in :mod:`course_utils.data.generated_coco`. Output is a pure function of the
arguments.
"""

from __future__ import annotations

import sys

from course_utils.data.generated_coco import PHOTO_SIDES, SIDES, TRAIN_IMAGES, VAL_IMAGES, generate
from data_prep import generator_command


def main(argv: list[str] | None = None) -> int:
    photo_sizes = (f"images {PHOTO_SIDES[0]}-{PHOTO_SIDES[1]} px a side, as COCO's photos, instead of "
                   f"{SIDES[0]}-{SIDES[1]}: the stand-in to time a detector on")
    return generator_command.run(__doc__, generate, "a tiny COCO-format set",
                                 "folder that receives train2017/, val2017/ and annotations/",
                                 (("train", TRAIN_IMAGES), ("val", VAL_IMAGES)), argv, ("photo-sizes", photo_sizes))


if __name__ == "__main__":
    sys.exit(main())
