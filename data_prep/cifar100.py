"""Download, check and extract the official CIFAR-100 archive; or verify an extracted tree.

The archive's MD5 is checked before anything in it is opened, let alone unpickled; the download,
the check and the all-or-nothing extraction are those of :mod:`data_prep.archives`.

    python -m data_prep.cifar100 --root data/cifar100           # download (if needed) and extract
    python -m data_prep.cifar100 --root data/cifar100 --verify  # re-check an extracted tree
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from course_utils.data.cifar import FOLDER, mismatched_files
from data_prep.archives import ArchiveError, check_archive, download, extract, run_command

URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
ARCHIVE_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
ARCHIVE_NAME = "cifar-100-python.tar.gz"


def verify(root: Path) -> list[str]:
    """Names of files of ``root/cifar-100-python`` that are missing or fail their checksums."""
    return mismatched_files(root)


def prepare(root: Path, url: str = URL, md5: str = ARCHIVE_MD5) -> Path:
    """Make ``root/cifar-100-python`` hold a verified CIFAR-100, downloading only what is missing."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if (root / FOLDER).is_dir() and not verify(root):
        return root / FOLDER
    archive = root / ARCHIVE_NAME
    if not archive.exists():
        download(url, archive)
    check_archive(archive, md5)
    folder = extract(archive, root, FOLDER)
    bad = verify(root)
    if bad:
        shutil.rmtree(folder)
        raise ArchiveError(f"after extraction {', '.join(bad)} failed the checksums; the folder was removed.")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="folder that receives cifar-100-python/")
    parser.add_argument("--verify", action="store_true", help="only re-check an extracted tree")
    parser.add_argument("--url", default=URL, help="where to download the archive from (default: the official URL)")
    args = parser.parse_args(argv)
    return run_command(
        args.verify, lambda: [f"{name} in {args.root / FOLDER} missing or damaged" for name in verify(args.root)],
        lambda: prepare(args.root, url=args.url), "CIFAR-100", f"python -m data_prep.cifar100 --root {args.root}",
        args.root)

if __name__ == "__main__":
    sys.exit(main())
