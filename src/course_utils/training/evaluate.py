"""Test loss and accuracy of the model (a detector's box AP), over every rank's share of the test set (notebooks
01-10)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from course_utils.data import coco
from course_utils.parallel.collectives import max_over_ranks, sum_over_ranks
from course_utils.parallel.sharding import is_sharded
from course_utils.training.detection_eval import evaluate_detection
from course_utils.training.setup import Setup


def score_line(scores: dict) -> str:
    """The scores of an evaluation in a few words: a classifier's top-1, a detector's box AP."""
    if "box_ap" in scores:
        return f"box AP {scores['box_ap']:.1f} (AP50 {scores['box_ap50']:.1f})"
    return f"test top-1 {scores['test_top1']:.1f} %"


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device,
             on_device: Callable[[torch.Tensor], torch.Tensor] | None = None,
             sharded: bool = False, lockstep: bool = False) -> dict[str, float]:
    """Test loss, top-1 and top-5 accuracy in percent; with ``sharded`` each rank scores its share
    and the sums are added over the ranks, so every rank returns the scores of the whole test set.
    With ``lockstep`` (FSDP, whose forward is a collective) every rank runs as many forward passes as
    the rank with the most batches: the others add passes over no images."""
    model.eval()
    sums = torch.zeros(4, device=device)  # loss, top-1 hits, top-5 hits, images
    batches = 0
    prepare = on_device or (lambda images: images)
    for images, labels in loader:
        batches += 1
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        logits = model(prepare(images))
        best = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hits = best == labels[:, None]
        sums += torch.stack([nn.functional.cross_entropy(logits.float(), labels, reduction="sum"),
                             hits[:, 0].sum(), hits.any(dim=1).sum(), torch.tensor(len(labels), device=device)])
    if lockstep:
        for _ in range(max_over_ranks(batches, device) - batches):
            model(prepare(images[:0]))  # the last batch's shape and dtype, as the model takes it
    model.train()
    if sharded:
        sum_over_ranks(sums)
    loss, top1, top5, count = sums.tolist()
    return {"test_loss": loss / count, "test_top1": 100 * top1 / count, "test_top5": 100 * top5 / count}


def evaluate_run(setup: Setup) -> dict[str, float]:
    """The scores of the run's model on the whole test set: a detector's box AP by pycocotools' COCOeval over
    every rank's detections, a classifier's test loss and accuracy."""
    test = setup.loaders.test
    with setup.autocast():
        if setup.cfg.detection:
            data = coco.ground_truth(test)
            return evaluate_detection(setup.model, test, setup.device, data.coco, data.categories)
        return evaluate(setup.model, test, setup.device, setup.loaders.test_on_device, setup.loaders.test_sharded,
                        lockstep=is_sharded(setup.model))
