"""Write a tiny COCO-format detection set in COCO 2017's layout (the ``ci`` size's data for notebook 10).

    python -m data_prep.tiny_coco --root data/tiny/coco [--train N --val N --seed 0]

What the files hold is in :mod:`course_utils.data.generated_coco`. Output is a pure function of the
arguments.
"""

from __future__ import annotations

from course_utils.data.generated_coco import TRAIN_IMAGES, VAL_IMAGES, generate
from data_prep import generator_command


def main(argv: list[str] | None = None) -> None:
    generator_command.run(__doc__, generate, "a tiny COCO-format set",
                          "folder that receives train2017/, val2017/ and annotations/",
                          (("train", TRAIN_IMAGES), ("val", VAL_IMAGES)), argv)


if __name__ == "__main__":
    main()
