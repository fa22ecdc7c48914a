"""ImageNet's archives to class folders, run on a tiny set generated in the official archives' formats: the labels
torchvision reads, resume, each bad input's one-line message, and the cloud recipe training on the result."""

import os
import shutil
import tarfile

import pandas as pd
import pytest
import torchvision.datasets.imagenet as torchvision_imagenet
from torchvision.datasets import ImageFolder

from course_utils.data import generated_imagenet
from course_utils.data.cifar import file_md5
from course_utils.run_folder import RunFolder
from data_prep import imagenet


@pytest.fixture
def archives(tmp_path):
    return generated_imagenet.generate(tmp_path / "archives", classes=4, train_per_class=6, val_per_class=3)


@pytest.fixture
def sums(archives):
    return imagenet.read_md5sums(archives / generated_imagenet.MD5SUMS)


def _prepare(archives, root, sums):
    return imagenet.prepare(archives, root, sums)


def _one_line(error):
    message = str(error.value)
    assert "\n" not in message
    return message


def test_torchvision_reads_the_generated_archives_as_imagenet(archives, sums, monkeypatch):
    """torchvision's own ImageNet code (its devkit parser and its extraction) accepts the tiny set's files."""
    for split, (name, _) in list(torchvision_imagenet.ARCHIVE_META.items()):
        monkeypatch.setitem(torchvision_imagenet.ARCHIVE_META, split, (name, sums[name]))  # the tiny set's sums
    val = torchvision_imagenet.ImageNet(archives, split="val")
    assert val.wnids == [wnid for wnid, _ in generated_imagenet.CLASSES[:4]] and len(val) == 12
    assert val.classes[0] == ("tench", "Tinca tinca")


def test_archives_become_class_folders_that_image_folder_reads_with_the_right_labels(archives, sums, tmp_path,
                                                                                     monkeypatch):
    root = _prepare(archives, tmp_path / "imagenet", sums)
    train, val = ImageFolder(root / "train"), ImageFolder(root / "val")
    devkit = imagenet.read_devkit(archives / imagenet.DEVKIT, sums[imagenet.DEVKIT])
    assert train.classes == val.classes == sorted(devkit.wnids) and len(train) == 24 and len(val) == 12
    for path, label in val.samples:  # each validation image in the class its ground-truth line names
        number = int(os.path.basename(path)[len("ILSVRC2012_val_"):-len(".JPEG")])
        assert val.classes[label] == devkit.val_wnids[number]
    # and the same labels as torchvision's own ImageNet reader gives the same images
    for split, (name, _) in list(torchvision_imagenet.ARCHIVE_META.items()):
        monkeypatch.setitem(torchvision_imagenet.ARCHIVE_META, split, (name, sums[name]))
    reference = torchvision_imagenet.ImageNet(archives, split="val")
    assert sorted((os.path.basename(p), t) for p, t in reference.samples) == \
        sorted((os.path.basename(p), t) for p, t in val.samples)
    assert not (root / imagenet.STAGING).exists() and imagenet.verify(root) == []
    assert imagenet.main(["--root", str(root), "--verify"]) == 0


def test_the_published_sums_refuse_other_archives_and_say_how_to_pass_theirs(archives, tmp_path):
    with pytest.raises(imagenet.PrepError) as error:
        imagenet.prepare(archives, tmp_path / "imagenet")
    message = _one_line(error)
    assert "fa75699e90414af021442c21a62c3abf (the published sum)" in message and "--md5sums" in message


@pytest.fixture
def extractions(monkeypatch):
    """The classes extracted from the training archive, in order; ``extractions.stop_after = n`` interrupts the
    run (as Ctrl-C, or a machine going away, would) when the class after the n-th starts."""
    extract = imagenet.extract_class

    class Extractions(list):
        stop_after = None

        def __call__(self, stream, target, *args):
            if len(self) == self.stop_after:
                raise KeyboardInterrupt
            extract(stream, target, *args)
            self.append(target.name)

    extractions = Extractions()
    monkeypatch.setattr(imagenet, "extract_class", extractions)
    return extractions


def test_an_interrupted_run_resumes_without_extracting_finished_classes_again(archives, sums, tmp_path, extractions):
    extractions.stop_after = 2
    with pytest.raises(KeyboardInterrupt):
        _prepare(archives, tmp_path / "imagenet", sums)
    assert not (tmp_path / "imagenet" / "train").exists()  # nothing published before the archive's MD5 matched
    extractions.stop_after = None
    root = _prepare(archives, tmp_path / "imagenet", sums)
    assert len(extractions) == 4 and len(set(extractions)) == 4  # the two finished classes were not redone
    assert imagenet.verify(root) == [] and len(ImageFolder(root / "train")) == 24


def test_a_partly_extracted_tree_is_named_and_only_its_unfinished_classes_are_redone(archives, sums, tmp_path,
                                                                                     extractions, capsys):
    root = _prepare(archives, tmp_path / "imagenet", sums)
    unfinished = root / "train" / generated_imagenet.CLASSES[1][0]
    (unfinished / imagenet.MARKER).unlink()  # as a tar -xf that stopped, or another tool's extraction, leaves it
    (root / "val" / generated_imagenet.CLASSES[2][0]).rename(root / "val-moved")
    capsys.readouterr()  # the progress bars so far
    assert imagenet.main(["--root", str(root), "--verify"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "train/n01443537 unfinished" in err and "val/n01484850 missing" in err
    assert "run: python -m data_prep.imagenet --archives DIR --root" in err
    extractions.clear()
    _prepare(archives, root, sums)
    assert extractions == [unfinished.name] and imagenet.verify(root) == []


def test_a_truncated_archive_is_refused_and_nothing_looks_finished(archives, sums, tmp_path):
    train = archives / imagenet.TRAIN
    train.write_bytes(train.read_bytes()[: train.stat().st_size // 2])
    with pytest.raises(imagenet.PrepError) as error:
        _prepare(archives, tmp_path / "imagenet", sums)
    assert "ends early" in _one_line(error) and "download it again" in str(error.value)
    assert not (tmp_path / "imagenet" / "train").exists() and not (tmp_path / "imagenet" / imagenet.STAGING).exists()


def test_a_changed_archive_fails_its_md5_after_the_pass_and_nothing_is_published(archives, sums, tmp_path):
    val = archives / imagenet.VAL
    val.write_bytes(val.read_bytes() + b"\0" * 10240)  # still a readable tar, no longer the same bytes
    with pytest.raises(imagenet.PrepError) as error:
        _prepare(archives, tmp_path / "imagenet", sums)
    assert f"expected {sums[imagenet.VAL]}" in _one_line(error)
    assert (tmp_path / "imagenet" / "train").is_dir() and not (tmp_path / "imagenet" / "val").exists()


def test_the_wrong_tar_under_the_training_name_is_named(archives, sums, tmp_path):
    shutil.copy(archives / imagenet.VAL, archives / imagenet.TRAIN)
    with pytest.raises(imagenet.PrepError) as error:
        _prepare(archives, tmp_path / "imagenet", {**sums, imagenet.TRAIN: sums[imagenet.VAL]})
    message = _one_line(error)
    assert "it is the validation archive (ILSVRC2012_img_val.tar), not ILSVRC2012_img_train.tar" in message
    assert "put the right file under that name" in message


def test_a_missing_devkit_says_where_the_labels_come_from(archives, sums, tmp_path):
    (archives / imagenet.DEVKIT).unlink()
    with pytest.raises(imagenet.PrepError) as error:
        _prepare(archives, tmp_path / "imagenet", sums)
    assert "ILSVRC2012_devkit_t12.tar.gz is missing" in _one_line(error) and "Development kit" in str(error.value)


def test_a_devkit_without_its_ground_truth_is_named(archives, sums, tmp_path):
    devkit = archives / imagenet.DEVKIT
    with tarfile.open(devkit, "w:gz") as tar:  # a devkit with meta.mat only
        tar.addfile(tarfile.TarInfo(generated_imagenet.META_MEMBER))
    sums[imagenet.DEVKIT] = file_md5(devkit)
    with pytest.raises(imagenet.PrepError) as error:
        _prepare(archives, tmp_path / "imagenet", sums)
    assert "has no ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt" in _one_line(error)


def test_command_line_errors_are_one_line(archives, tmp_path, capsys):
    assert imagenet.main(["--archives", str(archives / "absent"), "--root", str(tmp_path / "imagenet")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ILSVRC2012_devkit_t12.tar.gz is missing") and len(err.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.distributed
def test_cloud_recipe_trains_two_nodes_on_the_extracted_tiny_imagenet(archives, sums, tmp_path, two_cloud_nodes):
    """The CI half of the one-VM-against-two-VMs experiment: two torchrun agents meet through c10d like two VMs
    (jobs/cloud/run_node.sh, each started as a VM starts it), and each node samples its own devices."""
    root = _prepare(archives, tmp_path / "imagenet", sums)
    summary = two_cloud_nodes(["--data", "imagefolder", "--data-dir", str(root), "--device", "cpu", "--workers", "0",
                               "--max-steps", "3", "--batch-size", "4", "--monitor", "cpu",
                               "--monitor-interval", "0.05"])
    assert summary["world_size"] == 2 and [r["steps"] for r in summary["per_rank"]] == [3, 3]
    assert summary["config"]["data"] == "imagefolder"
    # Each "VM" is a node of its own (c10d numbered them), and each node's first process sampled it.
    assert sorted(r["node_rank"] for r in summary["per_rank"]) == [0, 1]
    nodes = summary["node_utilization"]
    assert [node["node_rank"] for node in nodes] == [0, 1] and all(node["backend"] == "cpu" for node in nodes)
    assert all(0 <= node["utilization_percent"] <= 100 for node in nodes)
    run = RunFolder(summary["out"])
    assert len(pd.read_csv(run.monitor)) > 0 and len(pd.read_csv(run.node_monitor(1))) > 0


def test_the_tiny_set_from_the_command_line_goes_through_the_same_path(tmp_path, capsys):
    from data_prep import tiny_imagenet

    tiny_imagenet.main(["--archives", str(tmp_path / "archives"), "--classes", "2", "--train-per-class", "3",
                        "--val-per-class", "2"])
    command = capsys.readouterr().out.split("extract them with: python -m data_prep.imagenet ")[1].split()
    command[command.index("DIR")] = str(tmp_path / "imagenet")
    assert imagenet.main(command) == 0 and len(ImageFolder(tmp_path / "imagenet" / "val")) == 4
