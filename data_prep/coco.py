"""Download, check and extract COCO 2017 (train2017, val2017 and their annotations, about 19 GB); or
verify an extracted tree (notebook 10 at the ``workshop`` size).

Each archive's MD5 is checked before it is opened; the resumable download, the check and the
all-or-nothing extraction are those of :mod:`data_prep.archives`. An archive is extracted into its own
folder (``annotations/``, ``val2017/``, ``train2017/``) and deleted afterwards unless ``--keep-archives``;
a folder already in place is not downloaded again, so an interrupted run continues where it stopped.

    python -m data_prep.coco --root data/coco           # download what is missing and extract it
    python -m data_prep.coco --root data/coco --verify  # re-check an extracted tree
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from course_utils.data.coco import problems
from data_prep.archives import ArchiveError, check_archive, download, extract, run_command

BASE_URL = "http://images.cocodataset.org"  # the address COCO's download page gives


@dataclass(frozen=True)
class Archive:
    """One official archive: its name, the folder of the base URL that serves it, its MD5, the folder it holds."""

    name: str
    url_folder: str
    md5: str
    folder: str

    def url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/{self.url_folder}/{self.name}"


# COCO's download page prints no checksums. These are the MD5 sums that other projects check the official
# files against, and the sources agree: intel/neural-compressor, examples/pytorch/fx/object_detection/maskrcnn/
# download_dataset.sh, and mlverse/torchvision (torchvision for R), R/dataset-coco.R.
ARCHIVES = (
    Archive("annotations_trainval2017.zip", "annotations", "f4bbac642086de4f52a3fdda2de5fa2c", "annotations"),
    Archive("val2017.zip", "zips", "442b8da7639aecaf257c1dceb8ba8c80", "val2017"),
    Archive("train2017.zip", "zips", "cced6f7f71b7629ddf16f17bbcfab6b2", "train2017"),
)


def verify(root: Path) -> list[str]:
    """Every problem of the tree at ``root`` (see :func:`course_utils.data.coco.problems`); empty when whole."""
    return problems(root)


def prepare(root: Path, base_url: str = BASE_URL, archives: tuple[Archive, ...] = ARCHIVES,
            keep_archives: bool = False) -> Path:
    """Make ``root`` hold a verified COCO 2017, downloading only the archives whose folder is not in place."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for archive in archives:
        if (root / archive.folder).is_dir():  # renamed into place only once whole
            continue
        path = root / archive.name
        if not path.exists():
            download(archive.url(base_url), path)
        check_archive(path, archive.md5)
        extract(path, root, archive.folder)
        if not keep_archives:
            path.unlink()
    found = verify(root)
    if found:
        raise ArchiveError(f"after extraction the tree in {root} is not whole: {'; '.join(found)}. Delete the "
                           f"folders named and run this command again.")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True,
                        help="folder that receives train2017/, val2017/ and annotations/")
    parser.add_argument("--verify", action="store_true", help="only re-check an extracted tree")
    parser.add_argument("--base-url", default=BASE_URL,
                        help="where the archives are served, as zips/ and annotations/ (default: COCO's own)")
    parser.add_argument("--keep-archives", action="store_true",
                        help="keep the zip files after extraction (19 GB; e.g. to stage them for a class)")
    args = parser.parse_args(argv)
    return run_command(args.verify, lambda: verify(args.root),
                       lambda: prepare(args.root, base_url=args.base_url, keep_archives=args.keep_archives),
                       "COCO 2017", f"python -m data_prep.coco --root {args.root}", args.root)

if __name__ == "__main__":
    sys.exit(main())
