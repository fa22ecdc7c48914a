"""COCO-format detection data for torchvision's detectors: the data set, its collate function, the label
ids and the checks of a COCO tree (notebook 10, and every detection run).

A tree holds COCO 2017's layout, ``train2017/``, ``val2017/`` and ``annotations/instances_<split>.json``:
the official set from ``python -m data_prep.coco`` or the tiny one from ``python -m data_prep.tiny_coco``.
Samples are ``(image, target)`` with the image a float tensor ``3 x H x W`` in [0, 1] at its own size
(the detector resizes and normalises it) and the target what torchvision's detectors train on:
``{"boxes": FloatTensor[N, 4] in (x1, y1, x2, y2) pixels, "labels": Int64Tensor[N], "image_id": int}``.

The data set is torchvision's ``CocoDetection`` with its own target conversion rather than
``wrap_dataset_for_transforms_v2``, whose COCO targets keep COCO's category ids (1-90 with gaps;
the detectors need 1..K, 0 being the background), keep crowd regions, and lack ``boxes`` and
``labels`` altogether for an image without objects.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision import tv_tensors
from torchvision.datasets import CocoDetection
from torchvision.ops import box_convert, clip_boxes_to_image
from torchvision.transforms import v2

from course_utils.data.cifar import DatasetCorruptError, DatasetMissingError
from course_utils.data.generated_coco import SPLITS, annotation_path

Target = dict[str, torch.Tensor | int]


@dataclass(frozen=True)
class Categories:
    """COCO's category ids and the detectors' contiguous labels, both ways: label ``i`` (from 1; 0 is the
    background of torchvision's detectors) is the ``i``-th category id in increasing order."""

    ids: tuple[int, ...]
    names: tuple[str, ...]

    @classmethod
    def from_coco(cls, categories: Sequence[dict]) -> Categories:
        """From an annotation file's ``categories`` list."""
        ordered = sorted(categories, key=lambda category: category["id"])
        return cls(tuple(c["id"] for c in ordered), tuple(c["name"] for c in ordered))

    @classmethod
    def of_splits(cls, *documents: dict) -> Categories:
        """The categories of every split together: a category that only the training annotations list still
        gets its label (and the detector's head its output), the same in every split."""
        merged = {}
        for document in documents:
            for category in document["categories"]:
                merged.setdefault(category["id"], category)
        return cls.from_coco(list(merged.values()))

    @property
    def num_classes(self) -> int:
        """What a torchvision detector's ``num_classes`` must be: the categories plus the background."""
        return len(self.ids) + 1

    def label(self, category_id: int) -> int:
        return self.ids.index(category_id) + 1

    def category_id(self, label: int) -> int:
        if not 1 <= label <= len(self.ids):
            raise ValueError(f"label {label} is not one of the {len(self.ids)} categories (labels 1..{len(self.ids)})")
        return self.ids[label - 1]


def ground_truth(loader: Iterable) -> CocoBoxes:
    """The data set behind a loader (or a rank's share of a part of it): its COCO annotations and categories."""
    dataset = loader.dataset
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def missing(root: Path, split: str) -> list[str]:
    """What a split needs and ``root`` lacks: its image folder and its annotation file (paths in ``root``)."""
    root = Path(root)
    needed = (root / split, annotation_path(root, split))
    return [str(path.relative_to(root)) for path in needed if not path.exists()]


def problems(root: Path) -> list[str]:
    """Every problem of the tree at ``root``, one line each: missing folders or annotation files, annotation
    files that are not COCO's or lack what COCOeval needs, images they list that are missing, empty, outside
    the image folder or (validation) unreadable. An empty list: the tree is whole."""
    root = Path(root)
    found = []
    for split in SPLITS:
        absent = missing(root, split)
        if absent:
            found += [f"{name} is missing" for name in absent]
            continue
        path = annotation_path(root, split)
        document, wrong = read_annotations(path)
        if wrong:
            found.append(f"{path.relative_to(root)} is not a COCO instances file: {_listed(wrong)}")
            continue
        found += image_problems(root, split, document)
    return found


def image_problems(root: Path, split: str, document: dict) -> list[str]:
    """The images of ``split`` that a run could not read: names that leave the image folder, files missing or
    empty, and, for the validation split (read whole at every evaluation), files that are not images; also a
    validation split without objects, on which COCOeval has nothing to score."""
    folder = Path(root) / split
    names = [image["file_name"] for image in document["images"]]
    outside = [name for name in names if not _inside(folder, name)]
    if outside:
        return [f"{split}: {len(outside)} file_name(s) lead outside {folder} ({', '.join(map(repr, outside[:3]))}); "
                "an annotation file names images inside its image folder"]
    bad = [name for name in names if not (folder / name).is_file() or (folder / name).stat().st_size == 0]
    found = []
    if bad:
        found.append(f"{split}: {len(bad)} of {len(names)} images missing or empty ({', '.join(bad[:3])}"
                     f"{', ...' if len(bad) > 3 else ''})")
    if split == SPLITS[1]:
        unreadable = [name for name in names if name not in bad and not _is_image(folder / name)]
        if unreadable:
            found.append(f"{split}: {len(unreadable)} of {len(names)} images cannot be read as images "
                         f"({', '.join(unreadable[:3])}{', ...' if len(unreadable) > 3 else ''})")
        if not any(not annotation.get("iscrowd", 0) for annotation in document["annotations"]):
            found.append(f"{split} has no objects (no annotation that is not a crowd region): box AP cannot be "
                         "computed on it")
    return found


def _inside(folder: Path, name: object) -> bool:
    """Whether ``name`` is a relative path that stays inside ``folder`` (no absolute path, no way out by ..)."""
    if not isinstance(name, str) or not name or Path(name).is_absolute():
        return False
    return (folder / name).resolve().is_relative_to(folder.resolve())


def _is_image(path: Path) -> bool:
    """Whether PIL recognizes ``path`` as an image (its header only: cheap for thousands of files)."""
    try:
        with Image.open(path) as picture:
            picture.size  # noqa: B018 - reading the header is the check
        return True
    except (OSError, SyntaxError, ValueError):
        return False


def kind(root: Path) -> str:
    """What COCO-format set lives at ``root``, without the folder (from its validation annotations)."""
    path = annotation_path(root, SPLITS[1])
    if not path.is_file():
        return "no COCO-format set"
    document = json.loads(path.read_text())
    info = document.get("info")  # optional in COCO's format: other tools write null, {} or empty strings
    description = (info.get("description") if isinstance(info, dict) else None) or "COCO-format set"
    return f"{description}, {len(document.get('images', []))} validation images"


def describe(root: Path) -> str:
    """One line saying what COCO-format set lives at ``root``, and where."""
    return f"{kind(root)}, in {root}"


def to_target(annotations: list[dict], image_id: int, categories: Categories, canvas_size: tuple[int, int]) -> Target:
    """torchvision's detection target from COCO annotations: crowd regions and degenerate boxes left out
    (as torchvision's detection references do), boxes as (x1, y1, x2, y2), labels contiguous."""
    kept = [a for a in annotations if not a.get("iscrowd", 0) and a["bbox"][2] > 0 and a["bbox"][3] > 0]
    xywh = torch.tensor([a["bbox"] for a in kept], dtype=torch.float32).reshape(-1, 4)
    # A box that reaches past the image is cut at its edge; one wholly outside it has no area left and goes.
    corners = clip_boxes_to_image(box_convert(xywh, "xywh", "xyxy"), canvas_size)
    inside = (corners[:, 2] > corners[:, 0]) & (corners[:, 3] > corners[:, 1])
    boxes = tv_tensors.BoundingBoxes(corners[inside], format=tv_tensors.BoundingBoxFormat.XYXY,
                                     canvas_size=canvas_size)
    labels = torch.tensor([categories.label(a["category_id"]) for a in kept], dtype=torch.int64)[inside]
    return {"boxes": boxes, "labels": labels, "image_id": image_id}


def annotation_problems(document: object) -> list[str]:
    """What makes an annotation file something other than COCO's instances format, or keeps COCOeval from
    scoring on it (nothing: an empty list). A missing ``iscrowd`` or ``area`` is not a problem: see
    :func:`fill_defaults`."""
    if not isinstance(document, dict):
        return ["it is not a JSON object"]
    absent = [key for key in ("images", "annotations", "categories") if not isinstance(document.get(key), list)]
    if absent:
        return [f"it has no {' / '.join(absent)} list"]
    if not all(isinstance(entry, dict) for key in ("images", "annotations", "categories") for entry in document[key]):
        return ["its images, annotations and categories are not all JSON objects"]
    categories = {category.get("id") for category in document["categories"]}
    images = {image.get("id") for image in document["images"]}
    problems = [f"image {image.get('id')} has no file_name" for image in document["images"] if "file_name" not in image]
    for annotation in document["annotations"]:
        name = f"annotation {annotation.get('id')}"
        if annotation.get("category_id") not in categories:
            problems.append(f"{name} has category id {annotation.get('category_id')}, which its categories do not list")
        elif annotation.get("image_id") not in images:
            problems.append(f"{name} is of image {annotation.get('image_id')}, which its images do not list")
        elif not (isinstance(annotation.get("bbox"), list) and len(annotation["bbox"]) == 4
                  and all(_is_number(value) for value in annotation["bbox"])):
            problems.append(f"{name} has no [x, y, width, height] bbox of numbers (it has {annotation.get('bbox')!r})")
        elif not all(_is_number(annotation.get(key, 0)) for key in ("iscrowd", "area")):
            problems.append(f"{name}'s iscrowd or area is not a number")
    return problems


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fill_defaults(document: dict) -> list[str]:
    """Give every annotation what COCOeval reads from it, where a tool left it out: ``iscrowd`` 0 (an object,
    not a crowd region), ``area`` its box's width x height (COCO's own area is the mask's, a little
    smaller), and an id from 1 where ids start at 0 or repeat. Returns what was changed, one line each, to
    say so (re-index the COCO object after a change of ids)."""
    said = []
    for key, default in (("iscrowd", lambda a: 0), ("area", lambda a: float(a["bbox"][2] * a["bbox"][3]))):
        lacking = [annotation for annotation in document["annotations"] if key not in annotation]
        for annotation in lacking:
            annotation[key] = default(annotation)
        if lacking:
            taken = "0 (not a crowd region)" if key == "iscrowd" else "the box's width x height"
            said.append(f"{len(lacking)} of {len(document['annotations'])} annotations have no {key}: taken as {taken}")
    # COCOeval records a match as the matched annotation's id, 0 meaning none: an object with id 0 (Roboflow
    # numbers from 0) could never be matched, and AP would come out too low.
    ids = [annotation.get("id") for annotation in document["annotations"]]
    if 0 in ids or len(set(ids)) < len(ids):
        for number, annotation in enumerate(document["annotations"], start=1):
            annotation["id"] = number
        said.append("annotation ids include 0 or repeat, which COCOeval cannot match: renumbered from 1")
    return said


def read_annotations(path: Path) -> tuple[dict | None, list[str]]:
    """An annotation file parsed, and what makes it something other than COCO's instances format."""
    try:
        document = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return None, [f"it is not JSON ({error})"]
    return document, annotation_problems(document)


def _listed(problems: list[str]) -> str:
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


class CocoBoxes(Dataset):
    """One split of a COCO-format tree as ``(image, target)`` for torchvision's detectors.

    ``augment`` flips half the images left to right (boxes with them), the augmentation of torchvision's
    Faster R-CNN recipe. ``prepare_hint`` is the command printed when the data is missing.
    """

    def __init__(self, root: str | Path, split: str = "train2017", augment: bool = False,
                 prepare_hint: str = "python -m data_prep.coco --root DIR") -> None:
        root = Path(root)
        absent = missing(root, split)
        if absent:
            raise DatasetMissingError(f"COCO-format data is not in {root} (missing: {', '.join(absent)}). "
                                      f"Prepare it with:\n    {prepare_hint}")
        path = annotation_path(root, split)
        try:  # the file is parsed once, by pycocotools; only a file it cannot index is read again, to say why
            with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its loading steps
                self.images = CocoDetection(str(root / split), str(path))
            problems = annotation_problems(self.images.coco.dataset)
        except (ValueError, KeyError, TypeError, AssertionError):
            problems = read_annotations(path)[1] or ["pycocotools cannot index it"]
        if problems:
            raise DatasetCorruptError(f"{path} is not a COCO instances file: {_listed(problems)}; "
                                      f"prepare the data again with:\n    {prepare_hint}")
        self.coco = self.images.coco  # the ground truth COCOeval compares detections with
        # Checked before the first step, not found at the end of an epoch: what the loader and COCOeval will read.
        problems = image_problems(root, split, self.coco.dataset)
        if problems:
            raise DatasetCorruptError(f"{root}: {'; '.join(problems)}; prepare the data again with:\n    "
                                      f"{prepare_hint}")
        filled = fill_defaults(self.coco.dataset)
        for said in filled:
            warnings.warn(f"{path.name}: {said}", stacklevel=2)
        if filled:
            with contextlib.redirect_stdout(io.StringIO()):
                self.coco.createIndex()  # by the new ids
        # This split's categories; a run gives both splits those of both (:func:`share_categories`).
        self.categories = Categories.from_coco(self.coco.dataset["categories"])
        self.flip = v2.RandomHorizontalFlip(0.5) if augment else None
        self.prepare_hint = prepare_hint

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Target]:
        try:
            picture, annotations = self.images[index]
        except FileNotFoundError as error:
            raise DatasetMissingError(f"{error.filename}, listed in the annotations, is missing; prepare the data "
                                      f"again with:\n    {self.prepare_hint}") from error
        image = v2.functional.to_dtype(v2.functional.to_image(picture), torch.float32, scale=True)
        target = to_target(annotations, self.images.ids[index], self.categories, tuple(image.shape[-2:]))
        if self.flip is not None:
            image, target = self.flip(image, target)
        target["boxes"] = target["boxes"].as_subclass(torch.Tensor)  # a plain tensor, as the detectors expect
        return image.as_subclass(torch.Tensor), target


def share_categories(*splits: CocoBoxes) -> Categories:
    """One label numbering for every split, from the categories of all of them: a category that only the
    training annotations list would otherwise size the detector's head too small, or shift the labels."""
    shared = Categories.of_splits(*(split.coco.dataset for split in splits))
    for split in splits:
        split.categories = shared
    return shared


def collate(batch: Sequence[tuple[torch.Tensor, Target]]) -> tuple[list[torch.Tensor], list[Target]]:
    """A batch as two lists, images and targets: images differ in size, and the detectors take lists."""
    return [image for image, _ in batch], [target for _, target in batch]
