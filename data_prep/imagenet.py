"""Turn the official ImageNet (ILSVRC2012) archives into the class folders ``--data imagefolder`` reads.

    python -m data_prep.imagenet --archives DIR --root ROOT            # extract (resumes where it stopped)
    python -m data_prep.imagenet --archives DIR --root ROOT --verify   # check a finished tree

DIR holds the three downloads from image-net.org: ``ILSVRC2012_img_train.tar`` (a tar of 1,000 per-class
tars), ``ILSVRC2012_img_val.tar`` (50,000 unlabelled images) and ``ILSVRC2012_devkit_t12.tar.gz`` (its
``data/meta.mat`` maps ILSVRC2012_ID to WNID and ``data/ILSVRC2012_validation_ground_truth.txt`` labels the
validation images). The result is ``ROOT/train/<wnid>/*.JPEG`` and ``ROOT/val/<wnid>/*.JPEG``.

One pass per archive: each is read once, as a stream, and the same bytes feed its MD5 (the published sums,
torchvision's table, unless ``--md5sums FILE`` names others) and the extraction; inner class tars are
extracted from the stream, never written to disk. Classes go to ``ROOT/.imagenet-staging/`` first and are
moved into ``ROOT/train`` and ``ROOT/val`` (renames, no second copy) only once the whole archive matched
its MD5, so a damaged archive leaves nothing in the tree that looks finished. A finished class folder holds
a marker, written before the folder is renamed into place; a class without one is extracted again. An
interrupted run keeps what it staged from the same archive file and does not write it again.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import scipy.io
from torchvision.datasets.imagenet import ARCHIVE_META
from tqdm.auto import tqdm

from course_utils.atomic_files import write_text_atomic
from course_utils.data.cifar import file_md5
from course_utils.data.generated_imagenet import GROUND_TRUTH_MEMBER, META_MEMBER, val_name
from course_utils.shared_folders import open_file
from data_prep import guard

PUBLISHED_MD5 = {name: md5 for name, md5 in ARCHIVE_META.values()}  # torchvision's table of the official sums
TRAIN, VAL, DEVKIT = (ARCHIVE_META[part][0] for part in ("train", "val", "devkit"))
STAGING = ".imagenet-staging"
MARKER = ".finished.json"  # in a class folder: it is whole (ImageFolder ignores the file)
RECORD = "imagenet-prep.json"  # in ROOT: the splits finished, with their classes
SOURCE = ".source.json"  # in a split's staging folder: which archive file its contents came from

# What an archive's first member says it is, for the message when the wrong file has the expected name.
KINDS = (
    (re.compile(r"n\d{8}\.tar"), f"the training archive ({TRAIN})"),
    (re.compile(r"ILSVRC2012_val_\d{8}\.JPEG"), f"the validation archive ({VAL})"),
    (re.compile(r"ILSVRC2012_test_\d{8}\.JPEG"), "the test archive, which has no labels"),
    (re.compile(r"(\./)?n\d{8}(/|_\d+\.JPEG)"), "an extracted or repacked copy, not the official archive"),
    (re.compile(rf"(\./)?{DEVKIT.split('.')[0]}/"), f"the development kit ({DEVKIT})"),
)
CLASS_TAR = KINDS[0][0]
VAL_IMAGE = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG")


class PrepError(RuntimeError):
    """Bad input or a damaged archive; the message is one line that names the fix."""


@dataclass(frozen=True)
class Devkit:
    """What the devkit says: the classes (their WNIDs in ILSVRC2012_ID order) and each validation image's class."""

    wnids: tuple[str, ...]
    val_wnids: dict[int, str]  # validation image number (from 1) -> WNID


def command(archives: Path, root: Path) -> str:
    return f"python -m data_prep.imagenet --archives {archives} --root {root}"


def read_md5sums(path: Path) -> dict[str, str]:
    """Archive name -> MD5 from a file in ``md5sum``'s format (``<md5>  <name>`` a line)."""
    sums = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        match = re.fullmatch(r"([0-9a-f]{32}) [ *](.+)", line.strip())
        if not match:
            raise PrepError(f"{path} line {number} is not '<md5>  <file name>'; write it as md5sum does")
        sums[Path(match.group(2)).name] = match.group(1)
    return sums


def archive_path(archives: Path, name: str, fix: str) -> Path:
    """``archives/name``, or a PrepError that says what the folder holds instead and where to get the file."""
    path = Path(archives) / name
    if path.is_file():
        return path
    present = sorted(p.name for p in Path(archives).glob("*.tar*")) if Path(archives).is_dir() else []
    holds = f"it holds {', '.join(present)}" if present else "it holds no archive"
    raise PrepError(f"{name} is missing from {archives} ({holds}); {fix}")


def _member(tar: tarfile.TarFile, name: str, archive: Path) -> bytes:
    try:
        stream = tar.extractfile(name)
    except KeyError:
        stream = None
    if stream is None:
        raise PrepError(f"{archive} has no {name}: it is not the ILSVRC2012 development kit; download "
                        f"{DEVKIT} ('Development kit (Task 1 & 2)') again")
    return stream.read()


def read_devkit(path: Path, md5: str) -> Devkit:
    """The classes and validation labels of the devkit at ``path``, after its MD5 matched ``md5``."""
    actual = file_md5(path)
    if actual != md5:
        raise md5_mismatch(path, actual, md5, f"download {DEVKIT} again")
    try:
        with tarfile.open(path, "r:gz") as tar:
            meta, truth = _member(tar, META_MEMBER, path), _member(tar, GROUND_TRUTH_MEMBER, path)
    except (tarfile.TarError, EOFError, OSError) as error:
        raise PrepError(f"{path} cannot be read as a .tar.gz ({error}); download {DEVKIT} again") from error
    synsets = scipy.io.loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
    leaves = sorted((int(s["ILSVRC2012_ID"]), str(s["WNID"])) for s in synsets if int(s["num_children"]) == 0)
    wnid_of = dict(leaves)
    try:
        val_wnids = {i: wnid_of[int(line)] for i, line in enumerate(truth.decode().split(), 1)}
    except (KeyError, ValueError) as error:
        raise PrepError(f"{path}: the validation ground truth names class {error}, which meta.mat does not list; "
                        f"download {DEVKIT} again") from error
    return Devkit(tuple(wnid for _, wnid in leaves), val_wnids)


class HashingReader:
    """A file read once, front to back, whose bytes also go to an MD5 and a progress bar."""

    def __init__(self, stream: BinaryIO, bar: tqdm) -> None:
        self.stream, self.bar, self.digest = stream, bar, hashlib.md5()

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.digest.update(data)
        self.bar.update(len(data))
        return data

    def finish(self) -> str:
        """Read what the tar reader left (its end-of-archive padding) and return the MD5 of the whole file."""
        while self.read(1 << 20):
            pass
        return self.digest.hexdigest()


def md5_mismatch(path: Path, actual: str, expected: str, fix: str) -> PrepError:
    published = expected == PUBLISHED_MD5.get(path.name)
    other = " (archives other than the official ones, like the tiny generated set: give --md5sums DIR/MD5SUMS)"
    return PrepError(f"{path} has MD5 {actual}, expected {expected}{' (the published sum)' if published else ''}: "
                     f"truncated, corrupted or another file; {fix}{other if published else ''}")


def wrong_archive(path: Path, member: str, expected: str) -> PrepError:
    kind = next((kind for pattern, kind in KINDS if pattern.match(member)), "not an ILSVRC2012 archive")
    return PrepError(f"{path} starts with {member}: it is {kind}, not {expected}. Nothing was extracted; "
                     f"put the right file under that name")


def _finished(folder: Path, md5: str) -> bool:
    """Whether ``folder`` is a class extracted whole from the archive whose MD5 is ``md5``."""
    try:
        return json.loads((folder / MARKER).read_text())["archive_md5"] == md5
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _mark(folder: Path, md5: str) -> None:
    images = sum(1 for p in folder.iterdir() if p.name != MARKER)
    write_text_atomic(folder / MARKER, json.dumps({"images": images, "archive_md5": md5}) + "\n")


def extract_class(stream: BinaryIO, target: Path, md5: str, archive: Path) -> None:
    """Extract one inner class tar from the outer tar's stream into ``target``, whole or not at all."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(fileobj=stream, mode="r|") as inner:
        for image in inner:
            if not image.isreg() or "/" in image.name or image.name.startswith("."):
                raise PrepError(f"{archive}: {target.name}.tar holds {image.name!r}, not an image file; "
                                f"this is not the official training archive")
            with open_file(partial / image.name, "wb") as out:
                shutil.copyfileobj(inner.extractfile(image), out, 1 << 20)
    _mark(partial, md5)
    os.replace(partial, target)


def _write_image(stream: BinaryIO, target: Path, size: int) -> None:
    """One validation image into ``target``; a file already there with the right size is kept."""
    if target.is_file() and target.stat().st_size == size:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    with open_file(partial, "wb") as out:
        shutil.copyfileobj(stream, out, 1 << 20)
    os.replace(partial, target)


def _staging(root: Path, split: str, archive: Path) -> Path:
    """The split's staging folder, emptied if what it holds came from another archive file."""
    folder = root / STAGING / split
    source = {"archive": str(archive.resolve()), "size": archive.stat().st_size,
              "mtime_ns": archive.stat().st_mtime_ns}
    try:
        same = json.loads((folder / SOURCE).read_text()) == source
    except (OSError, ValueError):
        same = False
    if not same:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        write_text_atomic(folder / SOURCE, json.dumps(source) + "\n")
    return folder


def _stream_archive(archive: Path, md5: str, expected: str, handle_member) -> None:
    """Read ``archive`` once as a tar stream, call ``handle_member(tar, member)`` for each member, then check
    the MD5 of every byte read. A damaged or wrong archive raises PrepError."""
    started = False
    with open(archive, "rb") as raw, tqdm(total=archive.stat().st_size, unit="B", unit_scale=True,
                                          desc=archive.name) as bar:
        reader = HashingReader(raw, bar)
        try:
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    if not started and not handle_member.accepts(member.name):
                        raise wrong_archive(archive, member.name, expected)
                    started = True
                    handle_member(tar, member)
        except tarfile.TarError as error:
            what = "ends early" if started else "is not a tar archive"
            raise PrepError(f"{archive} {what} ({error}): a truncated or damaged download. Nothing from it was "
                            f"moved into place; download it again and rerun this command") from error
        actual = reader.finish()
    if actual != md5:
        raise md5_mismatch(archive, actual, md5, "nothing from it was moved into place; download it again")


class _TrainMembers:
    """The training archive's members: one class tar each, extracted unless finished or already staged."""

    def __init__(self, archive: Path, md5: str, devkit: Devkit, final: Path, staging: Path) -> None:
        self.archive, self.md5, self.final, self.staging = archive, md5, final, staging
        self.classes, self.seen = set(devkit.wnids), set()

    @staticmethod
    def accepts(name: str) -> bool:
        return bool(CLASS_TAR.fullmatch(name))

    def __call__(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        wnid = member.name.removesuffix(".tar")
        if not self.accepts(member.name) or wnid not in self.classes:
            raise PrepError(f"{self.archive} holds {member.name}, which is not a class of the devkit; "
                            f"this is not the official training archive")
        self.seen.add(wnid)
        if _finished(self.final / wnid, self.md5) or _finished(self.staging / wnid, self.md5):
            return
        extract_class(tar.extractfile(member), self.staging / wnid, self.md5, self.archive)

    def missing(self) -> list[str]:
        return sorted(self.classes - self.seen)


class _ValMembers:
    """The validation archive's members: each image into the folder of the class the ground truth gives it."""

    def __init__(self, archive: Path, devkit: Devkit, staging: Path) -> None:
        self.archive, self.devkit, self.staging, self.seen = archive, devkit, staging, set()

    @staticmethod
    def accepts(name: str) -> bool:
        return bool(VAL_IMAGE.fullmatch(name))

    def __call__(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        match = VAL_IMAGE.fullmatch(member.name)
        wnid = self.devkit.val_wnids.get(int(match.group(1))) if match else None
        if wnid is None or not member.isreg():
            raise PrepError(f"{self.archive} holds {member.name}, which the devkit's ground truth does not label; "
                            f"the validation archive and the devkit do not belong together")
        self.seen.add(int(match.group(1)))
        _write_image(tar.extractfile(member), self.staging / wnid / member.name, member.size)

    def missing(self) -> list[str]:
        return [val_name(i) for i in sorted(set(self.devkit.val_wnids) - self.seen)]


def _publish(staging: Path, final: Path, md5: str, mark: bool) -> None:
    """Move every staged class into ``final`` (renames), replacing unfinished folders there."""
    final.mkdir(parents=True, exist_ok=True)
    for folder in sorted(p for p in staging.iterdir() if p.is_dir() and not p.name.endswith(".partial")):
        if mark:
            _mark(folder, md5)
        shutil.rmtree(final / folder.name, ignore_errors=True)
        os.replace(folder, final / folder.name)
    shutil.rmtree(staging)


def split_problems(root: Path, split: str, wnids: tuple[str, ...]) -> list[str]:
    """The classes of ``ROOT/split`` that are missing, unfinished or have lost images."""
    problems = []
    for wnid in wnids:
        folder = root / split / wnid
        try:
            images = json.loads((folder / MARKER).read_text())["images"]
        except (OSError, ValueError, KeyError, TypeError):
            problems.append(f"{wnid} unfinished" if folder.is_dir() else f"{wnid} missing")
            continue
        present = sum(1 for p in folder.iterdir() if p.name != MARKER)
        if present != images:
            problems.append(f"{wnid} has {present} of its {images} images")
    return problems


def _read_record(root: Path) -> dict:
    try:
        return json.loads((root / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def _record(root: Path, split: str, archive: Path, md5: str, wnids: tuple[str, ...]) -> None:
    record = _read_record(root)
    record[split] = {"archive": archive.name, "md5": md5, "classes": list(wnids)}
    write_text_atomic(root / RECORD, json.dumps(record, indent=1) + "\n")


def _unfinished_note(root: Path, split: str, md5: str) -> None:
    folders = [p for p in (root / split).iterdir() if p.is_dir()] if (root / split).is_dir() else []
    unfinished = [p.name for p in folders if not _finished(p, md5)]
    if unfinished:
        print(f"{root / split}: {len(unfinished)} class folder(s) without the marker of a finished class "
              f"(an interrupted or another extraction) will be extracted again")


def prepare_split(split: str, archives: Path, root: Path, md5sums: dict[str, str], devkit: Devkit) -> None:
    """Make ``ROOT/split`` hold every class of ``devkit``, from its archive, unless it already does."""
    name = TRAIN if split == "train" else VAL
    if _read_record(root).get(split, {}).get("md5") == md5sums[name] and not split_problems(root, split,
                                                                                            devkit.wnids):
        print(f"{root / split}: finished ({len(devkit.wnids)} classes), nothing to do")
        return
    where = "'Training images (Task 1 & 2)'" if split == "train" else "'Validation images (all tasks)'"
    archive = archive_path(archives, name, f"download {where} from the ILSVRC2012 page of image-net.org into it")
    _unfinished_note(root, split, md5sums[name])
    staging = _staging(root, split, archive)
    members = (_TrainMembers(archive, md5sums[name], devkit, root / split, staging) if split == "train"
               else _ValMembers(archive, devkit, staging))
    try:
        _stream_archive(archive, md5sums[name], name, members)
        missing = members.missing()
        if missing:
            raise PrepError(f"{archive} lacks {len(missing)} of the devkit's entries (first: {missing[0]}); "
                            f"the archive and the devkit do not belong together")
    except PrepError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _publish(staging, root / split, md5sums[name], mark=split == "val")
    _record(root, split, archive, md5sums[name], devkit.wnids)


def prepare(archives: Path, root: Path, md5sums: dict[str, str] | None = None) -> Path:
    """Extract both splits of the archives in ``archives`` into ``root``; return ``root``."""
    archives, root = Path(archives), Path(root)
    md5sums = {**PUBLISHED_MD5, **(md5sums or {})}
    root.mkdir(parents=True, exist_ok=True)
    record = _read_record(root)
    if not verify(root) and all(record[split]["md5"] == md5sums[name] for split, name in (("train", TRAIN),
                                                                                          ("val", VAL))):
        print(f"{root}: train/ and val/ finished, nothing to do")
        return root
    devkit_path = archive_path(archives, DEVKIT, "download 'Development kit (Task 1 & 2)' from the ILSVRC2012 "
                                                 "page of image-net.org into it; it holds the validation labels")
    devkit = read_devkit(devkit_path, md5sums[DEVKIT])
    try:
        for split in ("train", "val"):
            prepare_split(split, archives, root, md5sums, devkit)
    finally:
        with contextlib.suppress(OSError):  # left only where an interrupted split keeps what it staged
            (root / STAGING).rmdir()
    return root


def verify(root: Path) -> list[str]:
    """What is wrong with the tree under ``root`` (nothing: an empty list). Counts images, hashes none."""
    record = _read_record(Path(root))
    problems = [f"{split} was never finished" for split in ("train", "val") if split not in record]
    for split, entry in record.items():
        problems += [f"{split}/{problem}" for problem in split_problems(Path(root), split, tuple(entry["classes"]))]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archives", type=Path, help="folder with the three ILSVRC2012 downloads")
    parser.add_argument("--root", type=Path, required=True, help="folder that receives train/ and val/")
    parser.add_argument("--verify", action="store_true", help="only check a finished tree (counts, no hashing)")
    parser.add_argument("--md5sums", type=Path, default=None,
                        help="MD5s in md5sum's format for archives other than the official ones (the tiny "
                             "generated set writes its own); default: the published sums")
    args = parser.parse_args(argv)
    if not args.verify and args.archives is None:
        parser.error("--archives DIR is needed to extract (or give --verify)")
    fix = command(args.archives or "DIR", args.root)

    def work() -> int:
        try:
            if args.verify:
                problems = verify(args.root)
                if problems:
                    shown = ", ".join(problems[:5]) + (f" and {len(problems) - 5} more" if len(problems) > 5 else "")
                    print(f"FAILED: {args.root} is not a finished ImageNet tree ({shown}); run: {fix} "
                          f"(finished classes are kept)", file=sys.stderr)
                    return 1
                print(f"OK: {args.root} holds every class of train/ and val/, each with all its images")
                return 0
            md5sums = read_md5sums(args.md5sums) if args.md5sums else None
            prepare(args.archives, args.root, md5sums)
        except PrepError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        source = f"the MD5s in {args.md5sums}" if args.md5sums else "the published MD5s"
        print(f"ImageNet ready in {args.root}/train and {args.root}/val (archives checked against {source}); "
              f"train on it with --data imagefolder --data-dir {args.root}")
        return 0

    return guard.run(work, args.root)


if __name__ == "__main__":
    sys.exit(main())
