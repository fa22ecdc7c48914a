"""Write a tiny CIFAR-100 in exactly the official on-disk format (the ``ci`` size's data).

    python -m data_prep.tiny_cifar100 --root data/tiny [--train 5000 --test 1000 --seed 0]

What the files hold, and why they need no checksum file, is in
:mod:`course_utils.data.generated_cifar100`. Output is a pure function of the arguments.
"""

from __future__ import annotations

import sys

from course_utils.data.generated_cifar100 import generate
from data_prep import generator_command


def main(argv: list[str] | None = None) -> int:
    return generator_command.run(__doc__, generate, "tiny CIFAR-100", "folder that receives cifar-100-python/",
                                 (("train", 5000), ("test", 1000)), argv)


if __name__ == "__main__":
    sys.exit(main())
