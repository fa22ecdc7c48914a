import json

import numpy as np

from course_utils import config
from course_utils.experiments import reference


def test_recorded_rows_come_back_with_device_date_and_data(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "results_dir", lambda: tmp_path)
    path = reference.record("baseline", [{"model": "small_cnn", "images_per_second": 123.0}], "Test GPU 80GB",
                            "official CIFAR-100")
    assert path.parent == tmp_path and path.name.startswith("baseline-test-gpu-80gb-")
    # NumPy's scalars as a benchmark's rows hold them (a comparison of two measurements is a numpy.bool)
    other = reference.record("loop_overhead", [{"overhead_percent": float("nan"), "spread": np.float32("nan"),
                                                "graphs_replayed": np.bool_(True), "steps": np.int64(50)}], "CPU",
                             reference.SYNTHETIC)
    row = json.loads(other.read_text())["rows"][0]
    assert row == {"overhead_percent": None, "spread": None, "graphs_replayed": True, "steps": 50}
    assert '"overhead_percent": null' in other.read_text()  # strict JSON: no NaN
    table = reference.table("baseline")
    assert list(table["model"]) == ["small_cnn"] and table["device"][0] == "Test GPU 80GB"
    assert table["data"][0] == "official CIFAR-100"
    assert {"date", "torch", "cpu", "images_per_second"} <= set(table.columns)


def test_a_result_says_when_it_trained_on_the_generated_stand_in(tiny_root, tiny_coco, tmp_path, monkeypatch):
    """Speed needs the real sizes, not the real pixels: a stand-in is fair to measure on, if the file says so."""
    tiny = tmp_path / "data" / "tiny"  # the ci size's layout, made of the session's generated sets
    tiny.mkdir(parents=True)
    (tiny / "cifar-100-python").symlink_to(tiny_root / "cifar-100-python")
    (tiny / "coco").symlink_to(tiny_coco)
    monkeypatch.setenv(config.DATA_VARIABLE, str(tiny.parent))
    monkeypatch.setenv(config.SIZE_VARIABLE, "ci")
    used = reference.data_used()
    assert used.startswith("generated stand-in for CIFAR-100") and "600 train / 200 test images" in used
    assert str(tmp_path) not in used and str(tiny_root) not in used  # no machine's folder in a committed file
    detection = reference.data_used("coco")
    assert detection.endswith(" validation images") and str(tmp_path) not in detection
    monkeypatch.setenv(config.SIZE_VARIABLE, "workshop")
    assert reference.data_used() == "no CIFAR-100"  # the workshop size reads data/cifar100, not the tiny tree
    assert reference.data_used("synthetic") == reference.SYNTHETIC
