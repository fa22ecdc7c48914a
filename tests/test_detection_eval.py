"""Box AP by pycocotools' COCOeval: detections in COCO's result format, gathered over real gloo ranks,
images without detections, and a small detector that learns the tiny set."""

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course_utils.data.coco import CocoBoxes
from course_utils.parallel.process_group import free_port
from course_utils.training.detection_eval import METRICS, box_ap, coco_results


def _perfect(dataset):
    """Detections equal to the ground truth, as a detector's outputs would give them."""
    detections = {}
    for index in range(len(dataset)):
        _, target = dataset[index]
        output = {"boxes": target["boxes"], "labels": target["labels"], "scores": torch.ones(len(target["labels"]))}
        detections[target["image_id"]] = coco_results(output, target["image_id"], dataset.categories)
    return detections


def test_outputs_become_coco_results_in_xywh_with_coco_category_ids(tiny_coco):
    dataset = CocoBoxes(tiny_coco, "val2017")
    output = {"boxes": torch.tensor([[10.0, 20.0, 50.0, 30.0]]), "labels": torch.tensor([3]),
              "scores": torch.tensor([0.25])}
    assert coco_results(output, 7, dataset.categories) == [
        {"image_id": 7, "category_id": 18, "bbox": [10.0, 20.0, 40.0, 10.0], "score": 0.25}]


def test_the_ground_truth_scores_100_and_missing_images_count_against(tiny_coco, capsys):
    dataset = CocoBoxes(tiny_coco, "val2017")
    detections = _perfect(dataset)
    numbers = box_ap(dataset.coco, detections)
    has_large = any(a["area"] > 96**2 for a in dataset.coco.dataset["annotations"])
    assert numbers["box_ap"] == numbers["box_ap50"] == numbers["box_ap75"] == pytest.approx(100)
    assert (numbers["box_ap_large"] is not None) == has_large  # None: no object of that size to find
    assert numbers["detections"] == len(dataset.coco.dataset["annotations"])
    assert capsys.readouterr().out == ""  # COCOeval's own printing is kept out
    for image_id in list(detections)[: len(detections) // 2]:
        detections[image_id] = []  # half the images' objects not found
    assert 20 < box_ap(dataset.coco, detections)["box_ap"] < 80


def test_verbose_prints_cocoevals_summary(tiny_coco, capsys):
    dataset = CocoBoxes(tiny_coco, "val2017")
    box_ap(dataset.coco, _perfect(dataset), verbose=True)
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = 1.000" in capsys.readouterr().out


def test_no_detections_at_all_give_zeros_and_say_so(tiny_coco):
    dataset = CocoBoxes(tiny_coco, "val2017")
    with pytest.warns(UserWarning, match="detected nothing on the 32 evaluated images"):
        numbers = box_ap(dataset.coco, {image_id: [] for image_id in dataset.images.ids})
    assert numbers == {**dict.fromkeys(METRICS, 0.0), "detections": 0}


def _rank(rank, port, root, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        dataset = CocoBoxes(root, "val2017")
        everything = _perfect(dataset)
        ids = sorted(everything)
        share = ids[rank::2] + ([ids[0]] if rank == 1 else [])  # a padded DistributedSampler repeats an image
        numbers = box_ap(dataset.coco, {image_id: everything[image_id] for image_id in share})
        (out / f"rank{rank}.json").write_text(json.dumps(numbers))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
def test_two_gloo_ranks_score_the_whole_set_once(tiny_coco, tmp_path):
    mp.spawn(_rank, args=(free_port(), tiny_coco, tmp_path), nprocs=2)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0 == rank1  # every rank returns rank 0's numbers
    assert rank0["box_ap"] == pytest.approx(100)  # each rank held half the images: gathered, nothing missing
    assert rank0["detections"] == len(CocoBoxes(tiny_coco, "val2017").coco.dataset["annotations"])  # none twice

