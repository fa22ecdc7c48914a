"""The models of the course, all made by :func:`build` (notebook 00, and every run of notebooks 01-11).

ResNets come from torchvision's own builders. At ``image_size=32`` their 7x7 stride-2 stem and
max-pool would shrink a CIFAR image to 8x8 before the first block, so the stem becomes a 3x3
stride-1 convolution without max-pool, the usual CIFAR adaptation. At ``image_size=224`` they are
torchvision's standard networks, which is the LUMI workshop's set-up. ``small_cnn`` trains in
seconds on a CPU for CI; ``small_cnn_gn`` replaces BatchNorm by GroupNorm so that per-sample
results do not depend on the batch, which exact distributed comparisons need. The vision transformers
(``vit_*``, :mod:`course_utils.training.vision_transformer`) are what tensor parallelism splits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torchvision import models as tv_models

from course_utils.training.detection_models import DETECTOR_NAMES, build_detector
from course_utils.training.vision_transformer import VIT_SHAPES, Block, build_vit

RESNETS: dict[str, Callable[..., tv_models.ResNet]] = {
    "resnet18": tv_models.resnet18,
    "resnet50": tv_models.resnet50,
    "resnet152": tv_models.resnet152,
}
SMALL_MODELS = ("small_cnn", "small_cnn_gn")
CNN_NAMES = tuple(RESNETS) + SMALL_MODELS
VIT_NAMES = tuple(VIT_SHAPES)
CLASSIFIER_NAMES = CNN_NAMES + VIT_NAMES
MODEL_NAMES = CLASSIFIER_NAMES + DETECTOR_NAMES  # detectors train on COCO-format data (notebook 10)


class UnknownModelError(ValueError):
    """Raised for a model name :func:`build` does not know."""


def _conv_block(in_channels: int, out_channels: int, norm: Callable[[int], nn.Module]) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        norm(out_channels),
        nn.ReLU(inplace=True),
    )


def small_cnn(num_classes: int = 100, group_norm: bool = False) -> nn.Sequential:
    """Four 3x3 convolution blocks, each but the last followed by 2x2 pooling, and a linear head:
    about 0.25 M parameters and 13 M multiply-adds per image, so a CPU trains it quickly."""
    norm: Callable[[int], nn.Module] = (lambda c: nn.GroupNorm(8, c)) if group_norm else nn.BatchNorm2d
    return nn.Sequential(
        _conv_block(3, 32, norm),
        nn.MaxPool2d(2),
        _conv_block(32, 64, norm),
        nn.MaxPool2d(2),
        _conv_block(64, 128, norm),
        nn.MaxPool2d(2),
        _conv_block(128, 128, norm),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


def _cifar_stem(model: tv_models.ResNet) -> tv_models.ResNet:
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def build(name: str, num_classes: int = 100, image_size: int = 32) -> nn.Module:
    """A freshly initialised model called ``name`` for ``image_size`` x ``image_size`` inputs."""
    if name in RESNETS:
        model = RESNETS[name](weights=None, num_classes=num_classes)
        return _cifar_stem(model) if image_size < 64 else model
    if name in SMALL_MODELS:
        return small_cnn(num_classes, group_norm=name == "small_cnn_gn")
    if name in VIT_NAMES:
        return build_vit(name, num_classes, image_size)
    if name in DETECTOR_NAMES:
        return build_detector(name, num_classes)
    raise UnknownModelError(f"unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")


def blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated units of ``model``: a ResNet's residual blocks, a vision transformer's blocks, the small
    CNNs' convolution blocks. FSDP shards each on its own, and activation checkpointing recomputes each
    (notebook 09)."""
    residual = [m for m in model.modules()
                if isinstance(m, (tv_models.resnet.BasicBlock, tv_models.resnet.Bottleneck, Block))]
    return residual or [m for m in model.children() if isinstance(m, nn.Sequential)]


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """The number of (trainable) parameters: what "model size" means in the course."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def has_batch_norm(model: nn.Module) -> bool:
    """True when the model's output for one sample depends on the rest of its batch."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def parameter_table(names: tuple[str, ...] = CNN_NAMES, image_size: int = 32) -> list[dict]:
    """Parameter counts of the course's models, for the notebooks' model-size questions."""
    with torch.device("meta"):  # no memory and no initialisation cost: only the shapes count
        return [
            {"model": name, "parameters": count_parameters(build(name, image_size=image_size))}
            for name in names
        ]
