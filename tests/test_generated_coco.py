"""The tiny COCO-format set: COCO 2017's layout and keys, read unchanged by pycocotools and torchvision."""

import contextlib
import io
import json

import pytest
from pycocotools.coco import COCO
from torchvision.datasets import CocoDetection

from course_utils.data.generated_coco import CATEGORIES, SPLITS, annotation_path, generate


def _document(folder, split):
    return json.loads(annotation_path(folder, split).read_text())


def test_the_layout_and_keys_are_coco_2017s(tiny_coco):
    assert sorted(p.name for p in tiny_coco.iterdir()) == ["annotations", "train2017", "val2017"]
    for split in SPLITS:
        document = _document(tiny_coco, split)
        assert set(document) == {"info", "licenses", "images", "annotations", "categories"}
        image = document["images"][0]
        assert {"file_name", "height", "width", "id", "license"} <= set(image)
        assert image["file_name"] == f"{image['id']:012d}.jpg" and (tiny_coco / split / image["file_name"]).is_file()
        annotation = document["annotations"][0]
        assert set(annotation) == {"segmentation", "area", "iscrowd", "image_id", "bbox", "category_id", "id"}
        assert document["categories"] == list(CATEGORIES)
    ids = [c["id"] for c in CATEGORIES]
    assert ids != list(range(1, len(ids) + 1)), "COCO's category ids have gaps; the set keeps that"


def test_boxes_areas_and_polygons_agree(tiny_coco):
    document = _document(tiny_coco, "train2017")
    sizes = {image["id"]: (image["width"], image["height"]) for image in document["images"]}
    for annotation in document["annotations"]:
        x, y, w, h = annotation["bbox"]
        width, height = sizes[annotation["image_id"]]
        assert 0 <= x and 0 <= y and x + w <= width and y + h <= height and w > 0 and h > 0
        polygon = annotation["segmentation"][0]
        assert min(polygon[0::2]) == x and min(polygon[1::2]) == y
        assert 0.4 * w * h < annotation["area"] <= w * h + 0.01  # a triangle's area is half its box's


def test_images_differ_in_size_some_are_empty_and_ids_are_unique(tiny_coco):
    train, val = _document(tiny_coco, "train2017"), _document(tiny_coco, "val2017")
    assert len({(i["width"], i["height"]) for i in train["images"]}) > 10
    with_objects = {a["image_id"] for a in train["annotations"]}
    assert 0 < len(train["images"]) - len(with_objects) < len(train["images"]) // 4
    image_ids = [i["id"] for d in (train, val) for i in d["images"]]
    annotation_ids = [a["id"] for d in (train, val) for a in d["annotations"]]
    assert len(set(image_ids)) == len(image_ids) and min(image_ids) >= 1
    assert len(set(annotation_ids)) == len(annotation_ids) and min(annotation_ids) >= 1  # COCOeval's 0 is "no match"


def test_pycocotools_and_torchvision_read_it_unchanged(tiny_coco):
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(annotation_path(tiny_coco, "val2017")))
        dataset = CocoDetection(str(tiny_coco / "val2017"), str(annotation_path(tiny_coco, "val2017")))
    assert sorted(coco.getCatIds()) == [c["id"] for c in CATEGORIES] and len(coco.getImgIds()) == 32
    image, annotations = dataset[0]
    info = coco.loadImgs(dataset.ids[0])[0]
    assert image.size == (info["width"], info["height"]) and image.mode == "RGB"
    assert annotations == coco.loadAnns(coco.getAnnIds(dataset.ids[0]))


def test_generation_is_deterministic_and_replaces_a_tree_whole(tmp_path):
    a = generate(tmp_path / "a", train=8, val=4, seed=1)
    b = generate(tmp_path / "b", train=8, val=4, seed=1)
    c = generate(tmp_path / "c", train=8, val=4, seed=2)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert annotation_path(a, "train2017").read_text() != annotation_path(c, "train2017").read_text()
    generate(a, train=4, val=2, seed=1)
    assert len(list((a / "train2017").iterdir())) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no staging folder left behind


def test_bad_parameters_are_refused_and_leave_the_tree(tmp_path):
    folder = generate(tmp_path / "coco", train=4, val=2)
    with pytest.raises(ValueError, match="train images must be a whole number"):
        generate(folder, train=0)
    assert len(list((folder / "train2017").iterdir())) == 4


def test_the_photo_sized_stand_in_has_cocos_image_sizes_on_disk(tmp_path):
    from PIL import Image

    from course_utils.data.generated_coco import PHOTO_SIDES
    from data_prep import tiny_coco

    tiny_coco.main(["--root", str(tmp_path / "coco"), "--train", "6", "--val", "2", "--photo-sizes"])
    document = json.loads(annotation_path(tmp_path / "coco", "train2017").read_text())
    for image in document["images"]:
        with Image.open(tmp_path / "coco" / "train2017" / image["file_name"]) as picture:
            assert picture.size == (image["width"], image["height"])
        assert PHOTO_SIDES[0] <= min(picture.size) and max(picture.size) <= PHOTO_SIDES[1]
