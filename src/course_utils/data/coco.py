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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
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


def class_count(root: Path) -> int:
    """The detector's ``num_classes`` for the tree at ``root``: its categories and the background."""
    path = annotation_path(Path(root), SPLITS[1])  # the validation annotations, the smaller file
    if not path.is_file():
        raise DatasetMissingError(f"COCO-format data is not in {root} (missing: {path.relative_to(root)})")
    return Categories.from_coco(json.loads(path.read_text())["categories"]).num_classes


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
    files that are not COCO's, images they list that are missing or empty. An empty list: the tree is whole."""
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
        names = [image["file_name"] for image in document["images"]]
        folder = root / split
        bad = [name for name in names if not (folder / name).is_file() or (folder / name).stat().st_size == 0]
        if bad:
            found.append(f"{split}: {len(bad)} of {len(names)} images missing or empty ({', '.join(bad[:3])}"
                            f"{', ...' if len(bad) > 3 else ''})")
    return found


def kind(root: Path) -> str:
    """What COCO-format set lives at ``root``, without the folder (from its validation annotations)."""
    path = annotation_path(root, SPLITS[1])
    if not path.is_file():
        return "no COCO-format set"
    document = json.loads(path.read_text())
    description = document.get("info", {}).get("description", "COCO-format set")
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
    """What makes an annotation file something other than COCO's instances format (nothing: an empty list)."""
    if not isinstance(document, dict):
        return ["it is not a JSON object"]
    absent = [key for key in ("images", "annotations", "categories") if not isinstance(document.get(key), list)]
    if absent:
        return [f"it has no {' / '.join(absent)} list"]
    categories = {category.get("id") for category in document["categories"]}
    images = {image.get("id") for image in document["images"]}
    problems = [f"image {image.get('id')} has no file_name" for image in document["images"] if "file_name" not in image]
    for annotation in document["annotations"]:
        if annotation.get("category_id") not in categories:
            problems.append(f"annotation {annotation.get('id')} has category id {annotation.get('category_id')}, "
                            "which its categories do not list")
        elif annotation.get("image_id") not in images:
            problems.append(f"annotation {annotation.get('id')} is of image {annotation.get('image_id')}, "
                            "which its images do not list")
        elif not (isinstance(annotation.get("bbox"), list) and len(annotation["bbox"]) == 4):
            problems.append(f"annotation {annotation.get('id')} has no [x, y, width, height] bbox")
    return problems


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


def collate(batch: Sequence[tuple[torch.Tensor, Target]]) -> tuple[list[torch.Tensor], list[Target]]:
    """A batch as two lists, images and targets: images differ in size, and the detectors take lists."""
    return [image for image, _ in batch], [target for _, target in batch]
