"""The capstone's detectors: torchvision's Faster R-CNNs untrained, and the small one for the ci size, on
batches of images of different sizes, some without objects."""

import pytest
import torch

from course_utils.data.coco import CocoBoxes, collate
from course_utils.training.detection_models import DETECTOR_NAMES, build_detector
from course_utils.training.models import UnknownModelError, build


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_each_detector_has_the_data_s_classes_and_no_downloaded_weights(name, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # where torchvision would put downloaded weights
    model = build_detector(name, num_classes=4)
    assert model.roi_heads.box_predictor.cls_score.out_features == 4
    assert model.roi_heads.box_predictor.bbox_pred.out_features == 4 * 4
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownModelError, match="fasterrcnn_resnet50_fpn_v2, small_detector"):
        build("yolo", num_classes=4)
    with pytest.raises(ValueError, match="unknown detector 'resnet18'"):
        build_detector("resnet18", num_classes=4)


def test_the_small_detector_trains_and_detects_on_a_batch_with_an_empty_image(tiny_coco):
    dataset = CocoBoxes(tiny_coco, "train2017")
    images, targets = collate([dataset[i] for i in range(4, 8)])  # every eighth image has no objects
    assert targets[-1]["boxes"].shape == (0, 4) and len({tuple(i.shape) for i in images}) > 1
    torch.manual_seed(0)
    model = build_detector("small_detector", dataset.categories.num_classes)
    losses = model(images, targets)
    assert set(losses) == {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()
    model.eval()
    with torch.no_grad():
        outputs = model(images)
    assert len(outputs) == 4 and all(set(o) == {"boxes", "labels", "scores"} for o in outputs)
    assert all(o["boxes"].shape[1] == 4 and len(o["boxes"]) <= 20 for o in outputs)
