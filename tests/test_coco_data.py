"""The detection data set: torchvision's targets from COCO annotations, empty images, label ids both ways,
batches of different sizes, and a missing or damaged tree named with its fix."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Subset

from course_utils import config
from course_utils.data.cifar import DatasetCorruptError, DatasetMissingError
from course_utils.data.coco import Categories, CocoBoxes, collate, describe, ground_truth, problems, to_target
from course_utils.data.generated_coco import annotation_path
from course_utils.training.detection_eval import box_ap


def test_samples_are_what_torchvision_detectors_train_on(tiny_coco):
    dataset = CocoBoxes(tiny_coco, "val2017")
    annotations = {a["id"]: a for a in dataset.coco.dataset["annotations"]}
    for index in range(len(dataset)):
        image, target = dataset[index]
        info = dataset.coco.imgs[target["image_id"]]
        assert image.dtype == torch.float32 and image.shape == (3, info["height"], info["width"])
        assert 0 <= image.min() and image.max() <= 1
        assert target["boxes"].dtype == torch.float32 and target["labels"].dtype == torch.int64
        expected = [annotations[i] for i in dataset.coco.getAnnIds(imgIds=target["image_id"])]
        assert target["boxes"].shape == (len(expected), 4) and target["labels"].shape == (len(expected),)
        for box, label, annotation in zip(target["boxes"].tolist(), target["labels"].tolist(), expected):
            x, y, w, h = annotation["bbox"]
            assert box == pytest.approx([x, y, x + w, y + h])
            assert dataset.categories.category_id(label) == annotation["category_id"]


def test_an_image_without_objects_gives_empty_boxes_of_shape_0_by_4(tiny_coco):
    dataset = CocoBoxes(tiny_coco, "train2017")
    empty = [i for i, image_id in enumerate(dataset.images.ids) if not dataset.coco.getAnnIds(imgIds=image_id)]
    assert empty
    _, target = dataset[empty[0]]
    assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)


def test_labels_are_contiguous_from_one_and_map_back_to_coco_ids():
    categories = Categories.from_coco([{"id": 18, "name": "dog"}, {"id": 1, "name": "person"},
                                       {"id": 3, "name": "car"}])
    assert categories.num_classes == 4 and categories.names == ("person", "car", "dog")
    assert [categories.label(i) for i in (1, 3, 18)] == [1, 2, 3]
    assert [categories.category_id(label) for label in (1, 2, 3)] == [1, 3, 18]
    with pytest.raises(ValueError, match="label 0 is not one of the 3 categories"):
        categories.category_id(0)  # the background has no COCO id


def test_crowd_regions_and_degenerate_boxes_are_left_out(tiny_coco, tmp_path):
    root = tmp_path / "coco"
    shutil.copytree(tiny_coco, root)
    path = annotation_path(root, "val2017")
    document = json.loads(path.read_text())
    image_id = document["annotations"][0]["image_id"]
    before = sum(a["image_id"] == image_id for a in document["annotations"])
    document["annotations"] += [
        {**document["annotations"][0], "id": 10_000, "iscrowd": 1},
        {**document["annotations"][0], "id": 10_001, "bbox": [5.0, 5.0, 0.0, 3.0]},
    ]
    path.write_text(json.dumps(document))
    dataset = CocoBoxes(root, "val2017")
    _, target = dataset[dataset.images.ids.index(image_id)]
    assert len(target["boxes"]) == before


def test_flipping_mirrors_the_boxes_with_the_image(tiny_coco):
    plain, flipped = CocoBoxes(tiny_coco, "val2017"), CocoBoxes(tiny_coco, "val2017", augment=True)
    torch.manual_seed(0)
    outcomes = set()
    for index in range(8):
        (image, target), (image_f, target_f) = plain[index], flipped[index]
        width = image.shape[-1]
        mirrored = target["boxes"][:, [2, 1, 0, 3]] * torch.tensor([-1, 1, -1, 1]) + torch.tensor([width, 0, width, 0])
        if torch.equal(image_f, image.flip(-1)):
            assert torch.allclose(target_f["boxes"], mirrored)
            outcomes.add("flipped")
        else:
            assert torch.equal(image_f, image) and torch.equal(target_f["boxes"], target["boxes"])
            outcomes.add("kept")
    assert outcomes == {"flipped", "kept"}


def test_batches_of_different_sizes_are_lists(tiny_coco):
    loader = DataLoader(CocoBoxes(tiny_coco, "train2017"), batch_size=8, collate_fn=collate)
    images, targets = next(iter(loader))
    assert isinstance(images, list) and isinstance(targets, list) and len(images) == len(targets) == 8
    assert len({tuple(image.shape) for image in images}) > 1
    assert [t["image_id"] for t in targets] == list(range(1, 9))


def test_a_missing_tree_names_the_command_that_prepares_it(tmp_path):
    hint = config.prepare_command(config.SIZES["ci"], tmp_path / "coco", dataset="coco")
    with pytest.raises(DatasetMissingError, match="python -m data_prep.tiny_coco --root .*coco") as caught:
        CocoBoxes(tmp_path / "coco", "val2017", prepare_hint=hint)
    assert "val2017, annotations/instances_val2017.json" in str(caught.value)
    assert describe(tmp_path / "coco") == f"no COCO-format set, in {tmp_path / 'coco'}"


def test_problems_name_missing_images_and_annotation_files(tiny_coco, tmp_path):
    root = tmp_path / "coco"
    shutil.copytree(tiny_coco, root)
    assert problems(root) == []
    (root / "val2017" / "000000000130.jpg").unlink()
    annotation_path(root, "train2017").write_text("not json")
    found = problems(root)
    assert found[0].startswith("annotations/instances_train2017.json is not a COCO instances file: it is not JSON")
    assert found[1] == "val2017: 1 of 32 images missing or empty (000000000130.jpg)"
    # The same checks as the data set's: an annotation of a category the file does not list.
    path = annotation_path(tiny_coco, "val2017")
    document = json.loads(path.read_text())
    document["annotations"][0]["category_id"] = 999
    annotation_path(root, "train2017").write_text(json.dumps(document))
    assert "has category id 999, which its categories do not list" in problems(root)[0]


def test_bad_annotations_and_missing_images_are_named_with_the_fix(tiny_coco, tmp_path):
    root = tmp_path / "coco"
    shutil.copytree(tiny_coco, root)
    path = annotation_path(root, "val2017")
    document = json.loads(path.read_text())
    path.write_text(json.dumps({"images": document["images"]}))
    with pytest.raises(DatasetCorruptError, match="is not a COCO instances file: it has no annotations / "
                                                  "categories list; prepare the data again with:\n    HINT"):
        CocoBoxes(root, "val2017", prepare_hint="HINT")
    document["annotations"][0]["category_id"] = 999
    path.write_text(json.dumps(document))
    with pytest.raises(DatasetCorruptError, match="has category id 999, which its categories do not list"):
        CocoBoxes(root, "val2017", prepare_hint="HINT")
    document["annotations"][0]["category_id"] = document["categories"][0]["id"]
    path.write_text(json.dumps(document))
    data = CocoBoxes(root, "val2017", prepare_hint="HINT")
    (root / "val2017" / data.coco.loadImgs(data.images.ids[0])[0]["file_name"]).unlink()
    with pytest.raises(DatasetMissingError, match="listed in the annotations, is missing; prepare the data again"):
        data[0]


def test_a_box_past_the_edge_is_cut_there_and_one_outside_the_image_left_out():
    categories = Categories((1,), ("person",))
    target = to_target([{"bbox": [90, 10, 30, 20], "category_id": 1}, {"bbox": [200, 10, 5, 5], "category_id": 1}],
                       image_id=7, categories=categories, canvas_size=(50, 100))
    assert target["boxes"].tolist() == [[90.0, 10.0, 100.0, 30.0]] and target["labels"].tolist() == [1]


def test_the_ground_truth_behind_a_ranks_share_of_part_of_the_set(tiny_coco):
    """--test-samples takes part of the set, and a rank's loader a share of that part: two Subsets."""
    dataset = CocoBoxes(tiny_coco, "val2017")
    loader = DataLoader(Subset(Subset(dataset, range(16)), range(0, 16, 2)), collate_fn=collate)
    assert ground_truth(loader) is dataset


FIXTURES = Path(__file__).parent / "fixtures" / "coco"
OTHER_TOOLS = {  # file: what its info says (tests/fixtures/README names each file's source)
    "cocoapi_instances_val2017_1img.json": "COCO 2017 Dataset",
    "datumaro_instances_val.json": "COCO-format set",  # CVAT's exporter leaves every info field empty
    "roboflow_hard_hat_sample.json": "Exported from roboflow.ai",
}


def _tree_around(document: dict, root: Path) -> Path:
    """A COCO tree holding ``document`` as both splits, with a real JPEG of each listed size."""
    for split in ("train2017", "val2017"):
        (root / split).mkdir(parents=True)
        for image in document["images"]:
            Image.new("RGB", (image["width"], image["height"]), "gray").save(root / split / image["file_name"])
        annotation_path(root, split).parent.mkdir(exist_ok=True)
        annotation_path(root, split).write_text(json.dumps(document))
    return root


def _perfect_ap(dataset: CocoBoxes) -> float:
    """COCOeval's box AP of detections equal to the file's own boxes (crowd regions are not objects)."""
    detections = {image_id: [] for image_id in dataset.images.ids}
    for annotation in dataset.coco.dataset["annotations"]:
        if not annotation["iscrowd"]:
            detections[annotation["image_id"]].append({"image_id": annotation["image_id"], "score": 1.0,
                                                       "category_id": annotation["category_id"],
                                                       "bbox": annotation["bbox"]})
    return box_ap(dataset.coco, detections)["box_ap"]


@pytest.mark.parametrize("name", list(OTHER_TOOLS))
def test_coco_files_written_by_other_tools_are_read_checked_and_scored(name, tmp_path):
    document = json.loads((FIXTURES / name).read_text())
    root = _tree_around(document, tmp_path / "as written")
    assert problems(root) == [] and describe(root).startswith(OTHER_TOOLS[name])
    assert _perfect_ap(CocoBoxes(root, "val2017")) == pytest.approx(100.0)
    # Fields other tools write as null or leave out (edited copies of the same real file): a description
    # without info, and iscrowd/area that COCOeval reads for every object, filled in saying so.
    document["info"] = None
    for annotation in document["annotations"]:
        annotation.pop("iscrowd"), annotation.pop("area")
    root = _tree_around(document, tmp_path / "without")
    assert describe(root).startswith("COCO-format set")
    with pytest.warns(UserWarning) as said:
        dataset = CocoBoxes(root, "val2017")
    count = len(document["annotations"])
    assert {str(warning.message) for warning in said} >= {
        f"instances_val2017.json: {count} of {count} annotations have no iscrowd: taken as 0 (not a crowd region)",
        f"instances_val2017.json: {count} of {count} annotations have no area: taken as the box's width x height"}
    assert _perfect_ap(dataset) == pytest.approx(100.0)
