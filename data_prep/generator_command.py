"""The command line of the tiny-data generators of two splits: a root folder, each split's image count and
a seed (notebooks 00 and 10 at the ``ci`` size, and CI); and how every generator writes, tiny ImageNet's too."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from data_prep import guard


def run(description: str, generate: Callable[[Path, int, int, int], Path], what: str, root_help: str,
        splits: tuple[tuple[str, int], tuple[str, int]], argv: list[str] | None = None,
        switch: tuple[str, str] | None = None) -> int:
    """Parse ``--root``, one ``--<split>`` count per (split, default) pair and ``--seed``, call ``generate``
    with them in that order, and say what was written; a count ``generate`` refuses is a usage error, a folder
    that cannot take the files one line (:mod:`data_prep.guard`). Returns the exit status.
    ``switch`` (flag, help) adds one on/off option, passed to ``generate`` by its name."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help=root_help)
    for split, default in splits:
        parser.add_argument(f"--{split}", type=int, default=default, help=f"{split} images (default {default})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    if switch:
        parser.add_argument(f"--{switch[0]}", action="store_true", help=switch[1])
    args = parser.parse_args(argv)
    counts = [getattr(args, split) for split, _ in splits]
    options = {switch[0].replace("-", "_"): getattr(args, switch[0].replace("-", "_"))} if switch else {}
    return write(parser, lambda: generate(args.root, *counts, args.seed, **options),
                 lambda folder: f"wrote {what} ({' / '.join(f'{n} {split}' for n, (split, _) in zip(counts, splits))} "
                                f"images) to {folder}", args.root)


def write(parser: argparse.ArgumentParser, make: Callable[[], Path], said: Callable[[Path], str], root: Path,
          root_option: str = "--root") -> int:
    """Run ``make`` (a generator and its arguments) under :mod:`data_prep.guard` for ``root``, the folder
    ``root_option`` chose; a value it refuses is a usage error of ``parser``; print ``said`` of the folder
    written. Returns the exit status."""
    def work() -> int:
        try:
            folder = make()
        except ValueError as error:
            parser.error(str(error))
        print(said(folder))
        return 0

    return guard.run(work, root, chosen_by=root_option, probe_first=True)
