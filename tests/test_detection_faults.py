"""Faults of detection data, each made real on a copy of the tiny COCO-format set, run by the training command
with loader workers: what the run and COCOeval will need is checked before the first step (a fault is one
line that names it), what other tools leave out is filled in saying so, and an epoch's training is kept
even when its evaluation fails."""

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from course_utils.data.generated_coco import annotation_path
from course_utils.run_folder import RunFolder
from course_utils.train import main
from course_utils.training import checkpoint
from course_utils.training.options import to_flags

pytestmark = pytest.mark.slow


def _options(root: Path, out: Path, **extra) -> dict:
    return {"size": "ci", "data": "coco", "data_dir": str(root), "workers": 2, "device": "cpu", "progress": False,
            "out": str(out), "log_every": 1, **extra}


def _changed(tiny_coco: Path, tmp_path: Path, split: str, change: Callable[[dict, Path], None]) -> Path:
    """A copy of the tiny set whose ``split`` annotations (and image folder) ``change`` has edited."""
    root = tmp_path / "coco"
    shutil.copytree(tiny_coco, root)
    path = annotation_path(root, split)
    document = json.loads(path.read_text())
    change(document, root / split)
    path.write_text(json.dumps(document))
    return root


def _refused(root: Path, out: Path, capsys) -> str:
    """The run's one-line error; it must come before the first step (no metrics, no checkpoint)."""
    assert main(to_flags(**_options(root, out))) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "Traceback" not in error, error
    assert not RunFolder(out).metrics.exists() and not checkpoint.candidates(RunFolder(out).checkpoints)
    return error


def _no_iscrowd_or_area(document: dict, folder: Path) -> None:
    for annotation in document["annotations"]:
        del annotation["iscrowd"], annotation["area"]


def test_validation_annotations_without_iscrowd_and_area_are_filled_in_saying_so(tiny_coco, tmp_path, capsys):
    """As Azure ML's data labelling and other tools export them; COCOeval reads both for every object."""
    root = _changed(tiny_coco, tmp_path, "val2017", _no_iscrowd_or_area)
    with pytest.warns(UserWarning, match="annotations have no iscrowd: taken as 0"):
        assert main(to_flags(**_options(root, tmp_path / "run"))) == 0
    assert RunFolder(tmp_path / "run").read_summary()["box_ap"] is not None


def _no_objects(document: dict, folder: Path) -> None:
    document["annotations"] = []


def _missing_image(document: dict, folder: Path) -> None:
    (folder / document["images"][3]["file_name"]).unlink()


def _unreadable_image(document: dict, folder: Path) -> None:
    (folder / document["images"][3]["file_name"]).write_bytes(b"<html>a login page saved as a photo</html>")


def _string_box(document: dict, folder: Path) -> None:
    document["annotations"][0]["bbox"] = "10,10,40,40"


def _leaves_the_folder(document: dict, folder: Path) -> None:
    document["images"][0]["file_name"] = "../../../../../../../../etc/passwd"


@pytest.mark.parametrize(("split", "change", "said"), [
    ("val2017", _no_objects, "val2017 has no objects"),
    ("val2017", _missing_image, "val2017: 1 of 32 images missing or empty"),
    ("val2017", _unreadable_image, "val2017: 1 of 32 images cannot be read as images"),
    ("val2017", _string_box, "has no [x, y, width, height] bbox of numbers (it has '10,10,40,40')"),
    ("train2017", _leaves_the_folder, "train2017: 1 file_name(s) lead outside"),
], ids=["no-objects", "missing-image", "unreadable-image", "string-box", "path-outside"])
def test_a_data_fault_is_one_line_before_the_first_step(tiny_coco, tmp_path, capsys, split, change, said):
    root = _changed(tiny_coco, tmp_path, split, change)
    error = _refused(root, tmp_path / "run", capsys)
    assert said in error and "python -m data_prep" in error, error


def test_an_absolute_file_name_is_refused_and_never_opened(tiny_coco, tmp_path, capsys):
    secret = tmp_path / "outside.jpg"
    shutil.copy(next((tiny_coco / "train2017").iterdir()), secret)  # a readable image, elsewhere

    def absolute(document: dict, folder: Path) -> None:
        document["images"][0]["file_name"] = str(secret)

    root = _changed(tiny_coco, tmp_path, "train2017", absolute)
    assert "lead outside" in _refused(root, tmp_path / "run", capsys)


def test_a_category_only_the_training_split_has_gets_its_own_output(tiny_coco, tmp_path, capsys):
    """The head is sized from both splits' categories; sized from the validation file alone, a training label
    past its outputs stops the run mid-epoch."""
    def new_category(document: dict, folder: Path) -> None:
        document["categories"].append({"id": 91, "name": "hair drier", "supercategory": "indoor"})
        for annotation in document["annotations"][::3]:
            annotation["category_id"] = 91

    root = _changed(tiny_coco, tmp_path, "train2017", new_category)
    assert main(to_flags(**_options(root, tmp_path / "run"))) == 0, capsys.readouterr().err
    assert checkpoint.load(RunFolder(tmp_path / "run").last_checkpoint)["model"][
        "roi_heads.box_predictor.cls_score.bias"].shape[0] == 5  # 4 categories and the background


def test_the_epochs_training_is_kept_when_its_evaluation_fails(tiny_coco, tmp_path):
    """A validation image that disappears while the epoch trains (a cleaned scratch disk): the evaluation
    fails, but the epoch's checkpoint was written before it."""
    root = tmp_path / "coco"
    shutil.copytree(tiny_coco, root)
    run = RunFolder(tmp_path / "run")
    process = subprocess.Popen([sys.executable, "-m", "course_utils.train",
                                *to_flags(**_options(root, run.path))],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not (run.metrics.exists() and run.metrics.stat().st_size):  # the first step: every check passed
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.1)
    for image in (root / "val2017").iterdir():
        os.unlink(image)
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 1 and "listed in the annotations, is missing" in output, output[-3000:]
    kept = checkpoint.load(run.last_checkpoint)
    assert kept["epoch"] == 1 and kept["epoch_step"] == 0  # the whole first epoch, ready for the next
