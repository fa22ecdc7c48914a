from course_utils.lessons import reference


def test_recorded_rows_come_back_with_device_and_date(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "results_dir", lambda: tmp_path)
    path = reference.record("baseline", [{"model": "small_cnn", "images_per_second": 123.0}], "Test GPU 80GB")
    assert path.parent == tmp_path and path.name.startswith("baseline-test-gpu-80gb-")
    other = reference.record("loop_overhead", [{"overhead_percent": float("nan")}], "CPU")
    assert '"overhead_percent": null' in other.read_text()  # strict JSON: no NaN
    table = reference.table("baseline")
    assert list(table["model"]) == ["small_cnn"] and table["device"][0] == "Test GPU 80GB"
    assert {"date", "torch", "cpu", "images_per_second"} <= set(table.columns)
