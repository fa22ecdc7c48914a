"""A tiny COCO-format detection set in COCO 2017's own layout (notebook 10 at the ``ci`` size, CI).

``FOLDER/{train2017,val2017}/<12-digit id>.jpg`` and ``FOLDER/annotations/instances_{train,val}2017.json``
with COCO's keys (``info``, ``licenses``, ``images``, ``annotations`` with ``bbox`` [x, y, w, h],
``area``, ``iscrowd`` and polygon ``segmentation``, ``categories`` with supercategories), so that
pycocotools and ``torchvision.datasets.CocoDetection`` read it unchanged. The categories keep
COCO's real ids, names and supercategories (ids with gaps, as in COCO), each drawn as one shape in
one colour on a plain background: simple enough that a small detector trained for a minute on a
CPU scores a box AP above zero. Images differ in size, and every eighth has no object at all.

The files are a pure function of three numbers (training images, validation images, seed).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from course_utils.atomic_files import whole_directory

SPLITS = ("train2017", "val2017")
# Real COCO 2017 categories (id, name, supercategory), each drawn as a shape of its own colour.
CATEGORIES = (
    {"supercategory": "person", "id": 1, "name": "person"},
    {"supercategory": "vehicle", "id": 3, "name": "car"},
    {"supercategory": "animal", "id": 18, "name": "dog"},
)
SHAPES = {1: ("ellipse", (220, 40, 40)), 3: ("rectangle", (40, 80, 220)), 18: ("triangle", (40, 170, 60))}
SIDES = (112, 224)  # smallest and largest image side in pixels
PHOTO_SIDES = (360, 640)  # COCO 2017's photos: most are 640 px on the long side, 360-480 on the short
# An object's side before its aspect ratio (1:2 to 2:1): objects span COCO's small (< 32x32), medium and
# large (> 96x96) areas.
OBJECT_SIDES = (14, 128)
TRAIN_IMAGES, VAL_IMAGES = 128, 32  # the ci size's set: a few seconds per epoch for the small detector on a CPU
EMPTY_EVERY = 8  # every eighth image holds no object
JPEG_QUALITY = 95


def annotation_path(folder: Path, split: str) -> Path:
    """Where COCO keeps a split's instance annotations: ``annotations/instances_<split>.json``."""
    return Path(folder) / "annotations" / f"instances_{split}.json"


def image_file_name(image_id: int) -> str:
    """COCO's file name of an image: its id in twelve digits, ``000000000139.jpg``."""
    return f"{image_id:012d}.jpg"


def _polygon(shape: str, x: float, y: float, w: float, h: float) -> list[float]:
    """The outline of ``shape`` inside the box, as COCO's flat polygon ``[x1, y1, x2, y2, ...]``."""
    if shape == "rectangle":
        points = [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]
    elif shape == "triangle":
        points = [(x + w / 2, y), (x + w, y + h), (x, y + h)]
    else:
        angles = np.linspace(0, 2 * np.pi, 24, endpoint=False)
        points = list(zip(x + w / 2 * (1 + np.cos(angles)), y + h / 2 * (1 + np.sin(angles))))
    return [round(float(value), 2) for point in points for value in point]


def _area(polygon: list[float]) -> float:
    """The polygon's area (shoelace formula): COCO's ``area`` is the object's, not its box's."""
    xs, ys = np.asarray(polygon[0::2]), np.asarray(polygon[1::2])
    return round(float(abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2), 2)


def _bbox(polygon: list[float]) -> list[float]:
    xs, ys = polygon[0::2], polygon[1::2]
    return [min(xs), min(ys), round(max(xs) - min(xs), 2), round(max(ys) - min(ys), 2)]


def _overlaps(box: tuple[float, ...], boxes: list[tuple[float, ...]]) -> bool:
    x, y, w, h = box
    return any(x < bx + bw and bx < x + w and y < by + bh and by < y + h for bx, by, bw, bh in boxes)


def _objects(width: int, height: int, rng: np.random.Generator) -> list[tuple[int, tuple[float, ...]]]:
    """One to three (category id, box) pairs that fit in the image and do not overlap."""
    placed: list[tuple[int, tuple[float, ...]]] = []
    for _ in range(int(rng.integers(1, 4))):
        for _attempt in range(20):
            side, aspect = rng.integers(*OBJECT_SIDES), np.exp(rng.uniform(-np.log(2), np.log(2)))
            w, h = float(min(round(side * aspect**0.5), width)), float(min(round(side / aspect**0.5), height))
            box = (float(rng.integers(0, width - w + 1)), float(rng.integers(0, height - h + 1)), w, h)
            if not _overlaps(box, [b for _, b in placed]):
                placed.append((int(rng.choice([c["id"] for c in CATEGORIES])), box))
                break
    return placed


def _split(count: int, first_image_id: int, first_annotation_id: int, seed: int, rng: np.random.Generator,
           sides: tuple[int, int]) -> tuple[dict, dict[str, bytes]]:
    """A split's annotation file (as a dict) and its JPEG files by name."""
    images, annotations, files = [], [], {}
    for index in range(count):
        image_id = first_image_id + index
        width, height = (int(side) for side in rng.integers(sides[0], sides[1] + 1, size=2))
        background = tuple(int(v) for v in rng.integers(150, 236, size=3))
        picture = Image.new("RGB", (width, height), background)
        draw = ImageDraw.Draw(picture)
        objects = [] if index % EMPTY_EVERY == EMPTY_EVERY - 1 else _objects(width, height, rng)
        for category_id, box in objects:
            shape, colour = SHAPES[category_id]
            polygon = _polygon(shape, *box)
            draw.polygon(polygon, fill=colour)
            annotations.append({"segmentation": [polygon], "area": _area(polygon), "iscrowd": 0,
                                "image_id": image_id, "bbox": _bbox(polygon), "category_id": category_id,
                                "id": first_annotation_id + len(annotations)})
        name = image_file_name(image_id)
        buffer = io.BytesIO()
        picture.save(buffer, format="JPEG", quality=JPEG_QUALITY)
        files[name] = buffer.getvalue()
        images.append({"license": 1, "file_name": name, "coco_url": "", "height": height, "width": width,
                       "date_captured": "2017-01-01 00:00:00", "flickr_url": "", "id": image_id})
    document = {
        "info": {"description": f"Generated stand-in for COCO in its format, shapes instead of photos (seed {seed})",
                 "url": "", "version": "1.0", "year": 2017, "contributor": "course_utils",
                 "date_created": "2017/09/01"},
        "licenses": [{"url": "", "id": 1, "name": "Generated images, free to use"}],
        "images": images,
        "annotations": annotations,
        "categories": [dict(category) for category in CATEGORIES],
    }
    return document, files


def check_parameters(train: int, val: int, seed: int) -> None:
    """Refuse sizes this generator does not make: at least one image with objects per split."""
    for name, value in (("train", train), ("val", val)):
        if not isinstance(value, int) or not 1 <= value <= 100_000:
            raise ValueError(f"{name} images must be a whole number from 1 to 100000, not {value!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"the seed must be a whole number from 0, not {seed!r}")


def generate(folder: Path, train: int = TRAIN_IMAGES, val: int = VAL_IMAGES, seed: int = 0,
             photo_sizes: bool = False) -> Path:
    """Write the set to ``folder`` (its ``train2017/``, ``val2017/`` and ``annotations/``) atomically:
    everything is written beside it and renamed into place at once. ``photo_sizes``: images of COCO's
    own sizes, where JPEG decoding and resizing cost what they cost on COCO. Returns ``folder``."""
    check_parameters(train, val, seed)
    rng = np.random.default_rng(seed)
    with whole_directory(folder) as staging:
        first_image_id = first_annotation_id = 1  # ids from 1, disjoint between splits, as in COCO
        for split, count in zip(SPLITS, (train, val)):
            document, files = _split(count, first_image_id, first_annotation_id, seed, rng,
                                     PHOTO_SIDES if photo_sizes else SIDES)
            (staging / split).mkdir()
            for name, data in files.items():
                (staging / split / name).write_bytes(data)
            annotation_path(staging, split).parent.mkdir(exist_ok=True)
            annotation_path(staging, split).write_text(json.dumps(document))
            first_image_id += count
            first_annotation_id += len(document["annotations"])
    return Path(folder)
