"""Download, check and extract the official CIFAR-100 archive; or verify an extracted tree.

The archive's MD5 is checked before anything in it is opened, let alone unpickled. Extraction
goes to a temporary folder beside the target and is renamed into place only when complete, so
a failed or interrupted run never leaves a half-extracted ``cifar-100-python/`` behind.

    python -m data_prep.cifar100 --root data/cifar100           # download (if needed) and extract
    python -m data_prep.cifar100 --root data/cifar100 --verify  # re-check an extracted tree
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tqdm.auto import tqdm

from course_utils.data.cifar import FOLDER, file_md5, mismatched_files

URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
ARCHIVE_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
ARCHIVE_NAME = "cifar-100-python.tar.gz"


class ArchiveError(RuntimeError):
    """The archive is truncated, corrupted or not the one expected; nothing was extracted."""


def download(url: str, destination: Path) -> Path:
    """Stream ``url`` to ``destination`` through a ``.part`` file, with a progress bar."""
    partial = destination.with_name(destination.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {destination.name}") as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise ArchiveError(
            f"could not download {url} ({getattr(error, 'reason', error)}). Without network access here, "
            f"fetch {ARCHIVE_NAME} elsewhere, copy it to {destination} and run this command again.") from error
    os.replace(partial, destination)
    return destination


def check_archive(archive: Path, md5: str = ARCHIVE_MD5) -> None:
    """Refuse an archive whose MD5 is not ``md5`` (a truncated download, a corrupted copy)."""
    actual = file_md5(archive)
    if actual != md5:
        raise ArchiveError(
            f"{archive} has MD5 {actual}, expected {md5}: the file is truncated, corrupted or not "
            f"CIFAR-100. Nothing was extracted. Delete it and run this command again to download it anew.")


def extract(archive: Path, root: Path) -> Path:
    """Extract ``archive`` into ``root/cifar-100-python`` atomically; return that folder."""
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(staging, filter="data")
        except (tarfile.TarError, EOFError, OSError) as error:
            raise ArchiveError(f"{archive} could not be extracted ({error}); nothing was extracted.") from error
        if not (staging / FOLDER).is_dir():
            raise ArchiveError(f"{archive} holds no {FOLDER}/ folder; nothing was extracted.")
        target = root / FOLDER
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging / FOLDER, target)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
    folder = extract(archive, root)
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
    try:
        if args.verify:
            bad = verify(args.root)
            if bad:
                print(f"FAILED: {', '.join(bad)} in {args.root / FOLDER} missing or damaged; "
                      f"run: python -m data_prep.cifar100 --root {args.root}", file=sys.stderr)
                return 1
            print(f"OK: every file in {args.root / FOLDER} matches its checksum")
            return 0
        folder = prepare(args.root, url=args.url)
    except ArchiveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"CIFAR-100 ready in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
