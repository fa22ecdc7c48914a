"""A tiny ImageNet (ILSVRC2012) in exactly the official archives' formats, for the path that prepares the real
one (notebook 08's one-VM-against-two-VMs experiment at the ``ci`` size, and the tests of ``data_prep.imagenet``).

Three files, laid out like the official downloads:

- ``ILSVRC2012_img_train.tar``: a tar of one ``nXXXXXXXX.tar`` per class, each a tar of
  ``nXXXXXXXX_<i>.JPEG`` images;
- ``ILSVRC2012_img_val.tar``: ``ILSVRC2012_val_00000001.JPEG``... in one flat tar, with no labels;
- ``ILSVRC2012_devkit_t12.tar.gz``: ``ILSVRC2012_devkit_t12/data/meta.mat`` (MATLAB's ``synsets`` struct
  array: ILSVRC2012_ID, WNID, words, gloss, num_children, children, wordnet_height, num_train_images; the
  leaves first, then an inner node) and ``data/ILSVRC2012_validation_ground_truth.txt`` (one ILSVRC2012_ID
  per validation image, in file order).

The classes are real WordNet ids with their words, but their ILSVRC2012_IDs are this generator's own and
deliberately not in WNID order, so a reader that confuses the two gives wrong validation labels. Images are
the tiny CIFAR-100's class patterns (:mod:`course_utils.data.generated_cifar100`) at varied sizes, as real
photographs are, so that a short run learns above chance.

These archives' MD5s are not the published ones, so the generator writes them beside the archives in
``MD5SUMS`` (the format ``md5sum -c`` reads); ``data_prep.imagenet --md5sums`` takes that file, and without it
the published sums apply. Output is a pure function of the arguments.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import numpy as np
import scipy.io
from PIL import Image

from course_utils.atomic_files import write_atomic, write_text_atomic
from course_utils.data.generated_cifar100 import SIDE, class_templates, pattern_images

TRAIN_ARCHIVE = "ILSVRC2012_img_train.tar"
VAL_ARCHIVE = "ILSVRC2012_img_val.tar"
DEVKIT_ARCHIVE = "ILSVRC2012_devkit_t12.tar.gz"
DEVKIT_FOLDER = "ILSVRC2012_devkit_t12"
META_MEMBER = f"{DEVKIT_FOLDER}/data/meta.mat"
GROUND_TRUTH_MEMBER = f"{DEVKIT_FOLDER}/data/ILSVRC2012_validation_ground_truth.txt"
MD5SUMS = "MD5SUMS"

# (WNID, words) of real ILSVRC2012 classes; their parent below is an inner node of meta.mat, not a class.
CLASSES = (
    ("n01440764", "tench, Tinca tinca"),
    ("n01443537", "goldfish, Carassius auratus"),
    ("n01484850", "great white shark, white shark, man-eater, man-eating shark, Carcharodon carcharias"),
    ("n01491361", "tiger shark, Galeocerdo cuvieri"),
    ("n01494475", "hammerhead, hammerhead shark"),
    ("n01496331", "electric ray, crampfish, numbfish, torpedo"),
)
PARENT = ("n02512053", "fish")
FIXED_MTIME = 1_330_000_000  # a fixed date in the members' headers keeps the archives' bytes reproducible
MAX_SIDE = 48


def val_name(index: int) -> str:
    """The official name of validation image ``index`` (from 1)."""
    return f"ILSVRC2012_val_{index:08d}.JPEG"


def _jpeg(pixels: np.ndarray, rng: np.random.Generator) -> bytes:
    """One pattern image (a CHW row of the CIFAR layout) as a JPEG of a random size from 32 to 48 pixels a side."""
    image = Image.fromarray(pixels.reshape(3, SIDE, SIDE).transpose(1, 2, 0))
    width, height = (int(side) for side in rng.integers(SIDE, MAX_SIDE + 1, size=2))
    buffer = io.BytesIO()
    image.resize((width, height), Image.BILINEAR).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _tar(members: dict[str, bytes]) -> bytes:
    """An uncompressed tar of ``members`` (name -> bytes), in order, with fixed headers."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), FIXED_MTIME, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _meta_mat(ids: list[int]) -> bytes:
    """``meta.mat`` as the devkit has it: one struct per synset, the leaves (the classes) first."""
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
              "num_train_images"]
    synsets = np.empty((len(ids) + 1, 1), dtype=[(field, object) for field in fields])
    for row, ((wnid, words), ilsvrc_id) in enumerate(zip(CLASSES, ids)):
        synsets[row, 0] = (float(ilsvrc_id), wnid, words, f"a class of the tiny generated set: {words}", 0.0,
                           np.zeros((1, 0)), 0.0, 0.0)
    synsets[-1, 0] = (float(len(ids) + 1), PARENT[0], PARENT[1], "the inner node above the classes",
                      float(len(ids)), np.array([ids], dtype=float), 1.0, 0.0)
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, {"synsets": synsets})
    return buffer.getvalue()


def _devkit(ids: list[int], val_labels: np.ndarray) -> bytes:
    ground_truth = "".join(f"{ids[label]}\n" for label in val_labels).encode()
    tar = _tar({META_MEMBER: _meta_mat(ids), GROUND_TRUTH_MEMBER: ground_truth})
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=FIXED_MTIME) as compressed:
        compressed.write(tar)
    return buffer.getvalue()


def check_parameters(classes: int, train_per_class: int, val_per_class: int) -> None:
    """Refuse sizes this generator does not make."""
    if not 2 <= classes <= len(CLASSES):
        raise ValueError(f"classes must be from 2 to {len(CLASSES)}, not {classes!r}")
    for name, value in (("train_per_class", train_per_class), ("val_per_class", val_per_class)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number from 1, not {value!r}")


def archive_bytes(classes: int = 4, train_per_class: int = 24, val_per_class: int = 6,
                  seed: int = 0) -> dict[str, bytes]:
    """File name -> contents of the three archives."""
    check_parameters(classes, train_per_class, val_per_class)
    rng = np.random.default_rng(seed)
    templates = class_templates(rng)
    ids = [int(i) for i in rng.permutation(np.arange(1, classes + 1))]  # ILSVRC2012_ID of each class, not in order
    inner = {}
    for label, (wnid, _) in enumerate(CLASSES[:classes]):
        pixels = pattern_images(templates, np.full(train_per_class, label), rng)
        inner[f"{wnid}.tar"] = _tar({f"{wnid}_{i}.JPEG": _jpeg(row, rng) for i, row in enumerate(pixels, 1)})
    val_labels = rng.permutation(np.arange(classes * val_per_class) % classes)
    val_pixels = pattern_images(templates, val_labels, rng)
    return {
        TRAIN_ARCHIVE: _tar(inner),
        VAL_ARCHIVE: _tar({val_name(i): _jpeg(row, rng) for i, row in enumerate(val_pixels, 1)}),
        DEVKIT_ARCHIVE: _devkit(ids, val_labels),
    }


def generate(folder: Path, classes: int = 4, train_per_class: int = 24, val_per_class: int = 6,
             seed: int = 0) -> Path:
    """Write the three archives and their ``MD5SUMS`` into ``folder`` (each file whole or not at all)."""
    folder = Path(folder)
    files = archive_bytes(classes, train_per_class, val_per_class, seed)
    for name, data in files.items():
        write_atomic(folder / name, lambda stream, data=data: stream.write(data))
    sums = "".join(f"{hashlib.md5(data).hexdigest()}  {name}\n" for name, data in files.items())
    write_text_atomic(folder / MD5SUMS, sums)
    return folder
