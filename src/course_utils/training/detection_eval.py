"""Box AP of a detector by pycocotools' COCOeval, over every rank's share of the validation set (notebook 10,
and every detection run).

Each rank turns its detections into COCO's result format (``image_id``, ``category_id`` in COCO's
ids, ``bbox`` as [x, y, w, h], ``score``); the results are gathered to every rank, rank 0 runs
COCOeval over the images that were evaluated, and every rank returns its numbers. AP values are in
percent, as Detectron2 and the COCO leaderboard print them.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Iterable

import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import nn
from torchvision.ops import box_convert

from course_utils.data.coco import Categories
from course_utils.parallel import collectives

# COCOeval's first six summary numbers, in its order: AP over IoU 0.50:0.95, at 0.50, at 0.75, per object size.
METRICS = ("box_ap", "box_ap50", "box_ap75", "box_ap_small", "box_ap_medium", "box_ap_large")

Detections = dict[int, list[dict]]  # image id -> that image's results in COCO's format


def coco_results(output: dict[str, torch.Tensor], image_id: int, categories: Categories) -> list[dict]:
    """One image's detections (a torchvision detector's output: ``boxes`` as (x1, y1, x2, y2), ``labels``,
    ``scores``) as COCO result dicts."""
    boxes = output["boxes"].detach().float().cpu()
    xywh = box_convert(boxes, "xyxy", "xywh").tolist()
    return [{"image_id": image_id, "category_id": categories.category_id(label), "bbox": [round(v, 2) for v in box],
             "score": round(score, 5)}
            for box, label, score in zip(xywh, output["labels"].tolist(), output["scores"].float().tolist())]


@torch.no_grad()
def detect(model: nn.Module, loader: Iterable, device: torch.device, categories: Categories) -> Detections:
    """This rank's detections on the images ``loader`` yields (``(images, targets)`` batches as lists)."""
    model.eval()
    detections: Detections = {}
    for images, targets in loader:
        outputs = model([image.to(device, non_blocking=True) for image in images])
        for output, target in zip(outputs, targets):
            detections[int(target["image_id"])] = coco_results(output, int(target["image_id"]), categories)
    model.train()
    return detections


def gather_detections(detections: Detections) -> Detections:
    """Every rank's detections, on every rank. An image seen by two ranks (a DistributedSampler pads the
    last ranks' shares with repeated images) counts once, else its detections would count twice."""
    merged: Detections = {}
    for share in collectives.gather(detections):
        for image_id, results in share.items():
            merged.setdefault(image_id, results)
    return merged


def _coco_numbers(ground_truth: COCO, detections: Detections) -> tuple[dict[str, float | None], str]:
    results = [copy.copy(result) for image_results in detections.values() for result in image_results]
    if not results:  # COCOeval cannot load an empty result list
        warnings.warn(f"the model detected nothing on the {len(detections)} evaluated images: box AP is 0",
                      stacklevel=3)
        return dict.fromkeys(METRICS, 0.0), ""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        evaluation = COCOeval(ground_truth, ground_truth.loadRes(results), iouType="bbox")
        evaluation.params.imgIds = sorted(detections)  # only the images evaluated, as with a subset
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    # COCOeval writes -1 where no ground-truth object falls in a size range: no AP there, not a bad one.
    numbers = {name: (100 * float(value) if value >= 0 else None) for name, value in zip(METRICS, evaluation.stats)}
    return numbers, printed.getvalue()


def box_ap(ground_truth: COCO, detections: Detections, verbose: bool = False) -> dict[str, float | None]:
    """COCOeval's box AP, AP50, AP75 and AP per size (small, medium, large), in percent, over the images in
    ``detections`` (every rank's, gathered), and ``detections``: how many boxes were scored. Rank 0 computes,
    every rank returns the same numbers. ``verbose`` prints COCOeval's own summary (rank 0)."""
    detections = gather_detections(detections)
    numbers = None
    if not collectives.active() or torch.distributed.get_rank() == 0:
        numbers, printed = _coco_numbers(ground_truth, detections)
        if verbose:
            print(printed, end="")
        numbers["detections"] = sum(len(results) for results in detections.values())
    return collectives.from_rank_zero(numbers)


def evaluate_detection(model: nn.Module, loader: Iterable, device: torch.device, ground_truth: COCO,
                       categories: Categories) -> dict[str, float | None]:
    """Box AP of ``model`` on the images of ``loader`` (each rank its share): :func:`detect`, then :func:`box_ap`."""
    return box_ap(ground_truth, detect(model, loader, device, categories))

