"""The detectors of the capstone, all made by :func:`build_detector` (notebook 10, and every detection run).

``fasterrcnn_resnet50_fpn`` is the R50-FPN Faster R-CNN of Detectron2's baseline tables, in torchvision's
implementation (its published weights: 37.0 box AP on COCO val2017); ``fasterrcnn_resnet50_fpn_v2`` is
torchvision's improved version of it (46.7). Both start untrained here, backbone included (those numbers need
ImageNet-trained backbones): nothing is downloaded at run time. ``small_detector`` is a Faster
R-CNN over a small convolutional backbone for the ``ci`` size: it learns the tiny generated set
to a box AP above zero in a few dozen steps on a CPU, where torchvision's smallest detector
(``fasterrcnn_mobilenet_v3_large_320_fpn``, 19 M parameters) takes seconds per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from torchvision.models import detection
from torchvision.models.detection.faster_rcnn import FasterRCNN, FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.rpn import AnchorGenerator
from torchvision.ops import MultiScaleRoIAlign


@dataclass(frozen=True)
class DetectionRecipe:
    """What ``--data coco`` trains by default at a course size: the detector, its batch per process, rate and
    epochs (each flag given on the command line wins)."""

    model: str
    batch_size: int
    lr: float
    epochs: int


# workshop: Detectron2's 1x schedule, 90,000 iterations of 16 images, about 12 epochs of COCO's 118,287; 16
# images are 2 per GPU on 8 GPUs (on fewer GPUs, raise --batch-size so that the global batch stays 16).
DETECTION_RECIPES = {"ci": DetectionRecipe("small_detector", 4, 0.02, 1),
                     "workshop": DetectionRecipe("fasterrcnn_resnet50_fpn", 2, 0.02, 12)}

TORCHVISION_DETECTORS: dict[str, Callable[..., FasterRCNN]] = {
    "fasterrcnn_resnet50_fpn": detection.fasterrcnn_resnet50_fpn,
    "fasterrcnn_resnet50_fpn_v2": detection.fasterrcnn_resnet50_fpn_v2,
}
DETECTOR_NAMES = (*TORCHVISION_DETECTORS, "small_detector")


def _conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1, bias=False),
                         nn.GroupNorm(8, out_channels), nn.ReLU(inplace=True))


def small_detector(num_classes: int, channels: int = 64) -> FasterRCNN:
    """Faster R-CNN over four stride-2 convolution blocks (one feature map at 1/16 of the image), images
    resized to a shorter side of 128 pixels, anchors from 16 to 128 pixels at three aspect ratios.

    Fewer sampled regions than torchvision's defaults (64 per image instead of 512 for the box head,
    100 proposals instead of 2000): on a CPU the region pooling's backward pass otherwise takes most
    of a step, and a few objects per image need no more."""
    backbone = nn.Sequential(_conv_block(3, 32), _conv_block(32, 48), _conv_block(48, channels),
                             _conv_block(channels, channels))
    backbone.out_channels = channels
    representation = 256
    return FasterRCNN(
        backbone, num_classes=None,
        rpn_anchor_generator=AnchorGenerator(sizes=((16, 32, 64, 128),), aspect_ratios=((0.5, 1.0, 2.0),)),
        box_roi_pool=MultiScaleRoIAlign(featmap_names=["0"], output_size=7, sampling_ratio=2),
        box_head=TwoMLPHead(channels * 7 * 7, representation),
        box_predictor=FastRCNNPredictor(representation, num_classes),
        min_size=128, max_size=224,
        rpn_batch_size_per_image=64, rpn_pre_nms_top_n_train=300, rpn_post_nms_top_n_train=100,
        rpn_pre_nms_top_n_test=150, rpn_post_nms_top_n_test=50,
        box_batch_size_per_image=64, box_detections_per_img=20,
    )


def build_detector(name: str, num_classes: int) -> FasterRCNN:
    """A freshly initialised detector called ``name`` for ``num_classes`` classes, the background included
    (:attr:`course_utils.data.coco.Categories.num_classes`). No weights are downloaded."""
    if name in TORCHVISION_DETECTORS:
        return TORCHVISION_DETECTORS[name](weights=None, weights_backbone=None, num_classes=num_classes)
    if name == "small_detector":
        return small_detector(num_classes)
    raise ValueError(f"unknown detector {name!r}; choose one of: {', '.join(DETECTOR_NAMES)}")
