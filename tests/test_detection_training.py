"""Detection is a task of the one training command: the same loop, DDP, checkpoints and resume, with box AP
from pycocotools and seconds per iteration in the summary, on the tiny COCO-format set."""

import json

import pytest

from course_utils.experiments import detection_runs
from course_utils.lessons import detection
from course_utils.parallel.launch import launch
from course_utils.run_folder import RunFolder
from course_utils.train import main, train
from course_utils.training.options import to_flags


def _options(tiny_coco, out, **extra) -> dict:
    return {"size": "ci", "data": "coco", "data_dir": str(tiny_coco), "workers": 0, "device": "cpu",
            "progress": False, "out": str(out), **extra}


@pytest.mark.oldest
@pytest.mark.slow
def test_a_short_cpu_run_moves_box_ap_above_zero_and_reports_seconds_per_iteration(tiny_coco, tmp_path, capsys):
    summary = train(**_options(tiny_coco, tmp_path / "run", log_every=8))
    assert summary["config"]["model"] == "small_detector" and summary["global_batch_size"] == 4
    assert summary["box_ap"] > 0 and summary["box_ap50"] >= summary["box_ap"]
    assert summary["seconds_per_iteration"] > 0 and summary["test_top1"] is None and summary["mfu"] is None
    epoch = [json.loads(line) for line in RunFolder(tmp_path / "run").metrics.read_text().splitlines()][-1]
    assert epoch["kind"] == "epoch" and epoch["box_ap"] == summary["box_ap"]
    assert "box AP" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.distributed
def test_a_detector_trained_by_one_process_resumes_on_two_ddp_ranks(tiny_coco, tmp_path):
    """Its checkpoint holds the whole model: two DDP ranks go on from it at the same global batch (4 images each
    against the one process's 8), each training its share of the steps left."""
    out = tmp_path / "run"
    train(**_options(tiny_coco, out, batch_size=8, log_every=1, max_steps=2, checkpoint_every=1))
    resumed = launch(2, "course_utils.train", *to_flags(**_options(tiny_coco, out, distributed="ddp", batch_size=4,
                                                                   log_every=1, max_steps=4, resume="auto")),
                     log_dir=tmp_path / "logs", echo=False, timeout_seconds=300)
    assert resumed.ok, "\n".join(resumed.lines[-30:])
    assert "resuming from" in "\n".join(resumed.lines) and resumed.summary["steps"] == 4
    assert resumed.summary["world_size"] == 2 and resumed.summary["global_batch_size"] == 8
    assert list(resumed.per_rank["steps"]) == [4, 4] and resumed.summary["box_ap"] is not None


def test_a_detector_needs_boxes_and_a_classifier_needs_labels(tiny_coco, tiny_root, tmp_path, capsys):
    assert main(to_flags(**_options(tiny_coco, tmp_path / "a", model="resnet18"))) == 1
    assert "--data coco trains a detector: choose --model from" in capsys.readouterr().err
    assert main(to_flags(size="ci", data_dir=str(tiny_root), model="small_detector", out=str(tmp_path / "b"))) == 1
    assert "--model small_detector is a detector: train it on --data coco" in capsys.readouterr().err
    assert main(to_flags(**_options(tiny_coco, tmp_path / "c", loader="gpu-aug"))) == 1
    assert "--loader gpu-aug is not supported with --data coco" in capsys.readouterr().err
    missing = tmp_path / "nothing"
    assert main(to_flags(**_options(missing, tmp_path / "d"))) == 1
    assert "python -m data_prep" in capsys.readouterr().err


def test_the_teams_table_gives_speed_up_from_seconds_per_iteration():
    table = detection.team_table().set_index(["gpus", "interconnect"])
    assert table.loc[(2, "NVLink (HGX)"), "speedup"] == pytest.approx(0.6053 / 0.2942)
    assert table.loc[(4, "NVLink (HGX)"), "efficiency"] == pytest.approx(0.6053 / 0.1636 / 4)
    assert table.loc[(2, "PCIe"), "speedup"] < table.loc[(2, "NVLink (HGX)"), "speedup"]


def test_the_workshop_detector_takes_a_rate_scaled_to_its_batch_and_a_warm_up():
    one_gpu = detection_runs.workshop_recipe(2, steps=200)
    assert one_gpu == {"lr": pytest.approx(0.0025), "warmup_steps": 40}  # Detectron2's 0.02 is for 16 images
    assert detection_runs.workshop_recipe(16, steps=90_000) == {"lr": pytest.approx(0.02), "warmup_steps": 1000}


def test_without_coco_the_workshop_runs_use_the_photo_sized_stand_in_and_say_so(tmp_path, monkeypatch):
    from course_utils import config

    monkeypatch.setenv(config.DATA_VARIABLE, str(tmp_path))
    monkeypatch.setattr(detection_runs, "STAND_IN", (3, 2))
    root, said = detection_runs.detection_data("workshop")
    assert root == tmp_path / "coco-stand-in" and (root / "annotations").is_dir()
    assert "not prepared" in said and "python -m data_prep --size workshop --coco" in said
    assert "box AP says nothing" in said
    made = (root / "annotations").stat().st_mtime
    assert detection_runs.detection_data("workshop")[0] == root and (root / "annotations").stat().st_mtime == made
    options = detection_runs._options({"size": "workshop"})
    assert options["data_dir"] == root and options["lr"] == pytest.approx(0.0025) and options["warmup_steps"] == 40


@pytest.mark.slow
def test_a_diverging_detector_is_a_row_of_the_amp_table_not_a_failed_cell(tiny_coco, tmp_path):
    amp = detection_runs.amp_effect(("off",), out=tmp_path, size="ci", data_dir=str(tiny_coco), lr=1e9, max_steps=6,
                               log_every=1, device="cpu")
    assert amp.iloc[0]["status"].startswith("diverged") and "speedup" not in amp
    assert "not compared: off: diverged" in detection._amp_line(amp)
