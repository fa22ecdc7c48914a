import dataclasses

import pytest

from course_utils import config


def test_sizes_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.SIZES["ci"].epochs = 99


def test_unknown_size_lists_valid_values(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "huge")
    with pytest.raises(config.UnknownSizeError, match="ci, workshop"):
        config.get_size()


def test_size_from_environment(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "workshop")
    assert config.get_size().name == "workshop"


def test_default_size_without_gpu_is_ci(monkeypatch):
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    monkeypatch.setattr(config, "_gpu_visible", lambda: False)
    assert config.active_size_name() == "ci"


def test_sizes_keep_their_data_apart(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    ci, workshop = config.data_dir(config.SIZES["ci"]), config.data_dir(config.SIZES["workshop"])
    assert ci != workshop and ci.parent == workshop.parent == tmp_path


def test_prepare_command_names_the_generator_for_ci():
    assert config.prepare_command(config.SIZES["ci"]).startswith("python -m data_prep.tiny_cifar100 --root ")
    assert config.prepare_command(config.SIZES["workshop"]).startswith("python -m data_prep.cifar100 --root ")


def test_coco_data_has_its_own_folder_and_command_per_size(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    ci, workshop = config.SIZES["ci"], config.SIZES["workshop"]
    assert config.data_dir(ci, "coco") == tmp_path / "tiny" / "coco"
    assert config.data_dir(workshop, "coco") == tmp_path / "coco"
    assert config.prepare_command(ci, dataset="coco") == f"python -m data_prep.tiny_coco --root {tmp_path}/tiny/coco"
    assert config.prepare_command(workshop, dataset="coco") == f"python -m data_prep.coco --root {tmp_path / 'coco'}"
    with pytest.raises(ValueError, match="unknown data set 'voc'; choose one of: cifar100, coco"):
        config.data_dir(ci, "voc")



def test_a_ci_measurement_of_two_ranks_stays_within_one_epoch():
    """Every step of a throughput measurement of 06-10 is a training step: at ci the two CPU ranks' epoch holds
    them all, so no evaluation or loader restart falls among the timed steps."""
    from course_utils.experiments.runs import measured_steps

    ci = config.SIZES["ci"]
    assert measured_steps("ci") <= ci.train_samples // (2 * ci.batch_size)
