"""Official archives, fetched and opened safely: a resumable download, a checksum before anything is
opened, and an extraction that appears whole or not at all (CIFAR-100, COCO 2017).

A download streams into ``NAME.part`` and takes its final name only when complete; an interrupted
one continues where it stopped when the server honours HTTP ranges. Extraction goes to a temporary
folder beside the target and is renamed into place only when complete, so a failed or interrupted
run never leaves a half-extracted folder behind.
"""

from __future__ import annotations

import http.client
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from course_utils.atomic_files import replace_directory, staging_folder
from course_utils.data.cifar import file_md5
from course_utils.shared_folders import naming_the_file, open_file
from data_prep import guard

PARTIAL_CONTENT = 206
RANGE_NOT_SATISFIABLE = 416  # asked for bytes past the end: the partial file is already whole


class ArchiveError(RuntimeError):
    """The archive is truncated, corrupted or not the one expected; nothing was extracted."""


def _stream(url: str, partial: Path, label: str) -> None:
    """Append ``url``'s bytes past ``partial``'s length to it, or write it anew where ranges are not served."""
    offset = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as error:
        if offset and error.code == RANGE_NOT_SATISFIABLE:
            return
        raise
    with response:
        if getattr(response, "status", None) != PARTIAL_CONTENT:
            offset = 0  # the whole file came (a server without ranges, a file:// URL): start over
        length = int(response.headers.get("Content-Length") or 0)
        with open_file(partial, "ab" if offset else "wb") as out, \
                tqdm(total=offset + length or None, initial=offset, unit="B", unit_scale=True,
                     desc=f"downloading {label}") as bar:
            while chunk := response.read(1 << 20):
                with naming_the_file(partial):
                    out.write(chunk)
                bar.update(len(chunk))
            if length and out.tell() < offset + length:  # http.client ends a cut-off body without an error
                raise ConnectionError(f"the connection closed after {out.tell()} of {offset + length} bytes")


def download(url: str, destination: Path) -> Path:
    """Fetch ``url`` to ``destination`` through ``destination.part``, with a progress bar; a ``.part`` left
    by an interrupted run is continued (HTTP range request), not started again."""
    partial = destination.with_name(destination.name + ".part")
    try:
        _stream(url, partial, destination.name)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
        if guard.is_refusal(error):  # the disk, not the network: the guard names that fix
            raise
        received = partial.stat().st_size if partial.exists() else 0
        if received:
            kept = f" The {received} bytes in {partial} are kept: running this command again continues from there."
        else:
            kept = ""
            partial.unlink(missing_ok=True)
        raise ArchiveError(
            f"could not download {url} ({getattr(error, 'reason', error)}). Without network access here, "
            f"fetch {destination.name} elsewhere, copy it to {destination} and run this command again.{kept}"
        ) from error
    os.replace(partial, destination)
    return destination


def check_archive(archive: Path, md5: str) -> None:
    """Refuse an archive whose MD5 is not ``md5`` (a truncated download, a corrupted copy)."""
    actual = file_md5(archive)
    if actual != md5:
        raise ArchiveError(
            f"{archive} has MD5 {actual}, expected {md5}: the file is truncated, corrupted or not the "
            f"official {archive.name}. Nothing was extracted. Delete it and run this command again to download "
            f"it anew.")


def _unpack(archive: Path, staging: Path) -> None:
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as bundle:  # names with .. or a leading / are made safe by extract()
            for member in tqdm(bundle.infolist(), desc=f"extracting {archive.name}", unit="file"):
                bundle.extract(member, staging)
    else:
        with tarfile.open(archive) as bundle:
            bundle.extractall(staging, filter="data")


def extract(archive: Path, root: Path, folder: str) -> Path:
    """Extract ``archive``, whose content is one top-level ``folder``, into ``root/folder`` atomically;
    return that folder. An existing ``root/folder`` is replaced."""
    staging = staging_folder(root, ".extract-")
    try:
        try:
            _unpack(archive, staging)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as error:
            if guard.is_refusal(error):
                raise
            raise ArchiveError(f"{archive} could not be extracted ({error}); nothing was extracted.") from error
        if not (staging / folder).is_dir():
            raise ArchiveError(f"{archive} holds no {folder}/ folder; nothing was extracted.")
        target = root / folder
        replace_directory(staging / folder, target)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def run_command(verify_only: bool, verify: Callable[[], list[str]], prepare: Callable[[], Path], name: str,
                fix: str, root: Path) -> int:
    """What a data_prep command prints and returns: with ``verify_only`` the problems ``verify`` finds and
    the command ``fix`` that mends them, else the folder ``prepare`` makes ready in ``root``, or the error
    it met (the file system's refusals as :mod:`data_prep.guard` says them)."""
    def work() -> int:
        try:
            if verify_only:
                found = verify()
                if found:
                    print(f"FAILED: {'; '.join(found)}; run: {fix}", file=sys.stderr)
                    return 1
                print(f"OK: the {name} tree is whole")
                return 0
            folder = prepare()
        except ArchiveError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(f"{name} ready in {folder}")
        return 0

    return guard.run(work, root)
