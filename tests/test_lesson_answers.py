"""The answers of notebooks 01-02 read noisy and contradictory tables as noise, never as findings, and the
reference tables cite GPU results only where a GPU recorded them."""

import json
from pathlib import Path

import pandas as pd
import pytest

from course_utils.experiments import reference
from course_utils.lessons import baseline, monitoring
from course_utils.observe.metrics import Run


def _run(epoch_seconds: list[float], iteration_ms: list[float], steps_per_epoch: int = 10) -> Run:
    iterations = pd.DataFrame({"step": range(len(iteration_ms)), "seconds": [ms / 1000 for ms in iteration_ms],
                               "data_seconds": 0.0,
                               "epoch": [i // steps_per_epoch for i in range(len(iteration_ms))]})
    epochs = pd.DataFrame({"epoch": range(len(epoch_seconds)), "seconds": epoch_seconds})
    summary = {"warmup_steps": 5, "steps_per_epoch": steps_per_epoch, "images_per_second": 1000.0,
               "device": "CPU", "config": {"workers": 0}}
    return Run(Path("."), iterations, pd.DataFrame(), epochs, summary)


STEADY = [10.0, 10.5, 9.8, 10.2, 10.1] * 6


def test_a_first_epoch_faster_than_the_rest_is_a_disturbed_measurement_not_a_finding():
    """The known bad case: a busy machine made the later epochs slower, and 01 printed "first epoch faster"."""
    text = baseline.warmup(_run([1.0, 1.5, 1.45, 1.48], [40, 20, 15, 12, 11] + STEADY[5:]))
    assert "**disturbed measurement**" in text and "at most 1.00x" in text
    assert "Warm-up cost" not in text


def test_epochs_inside_their_spread_are_no_measurable_difference():
    text = baseline.warmup(_run([1.05, 1.0, 1.1, 0.95], [40, 20, 15, 12, 11] + STEADY[5:]))
    assert "**no measurable difference**" in text and "Warm-up cost" not in text


def test_a_first_epoch_slower_past_the_spread_is_warm_up():
    text = baseline.warmup(_run([2.0, 1.0, 1.02, 1.01], [400, 20, 15, 12, 11] + STEADY[5:]))
    assert "**slower**" in text and "Warm-up cost about **0.99 s** once" in text


def test_first_iterations_faster_than_the_steady_state_are_disturbed():
    text = baseline.warmup(_run([1.0, 1.0, 1.0, 1.0], [5, 5, 5, 5, 5] + [20.0, 20.5, 19.8, 20.2, 20.1] * 6))
    assert "**disturbed measurement**" in text.splitlines()[0]


def test_with_two_later_epochs_the_spread_is_unknown_and_said_so():
    text = baseline.warmup(_run([2.0, 1.0, 1.1], [400, 20, 15, 12, 11] + STEADY[5:]))
    assert "spread unknown" in text and "cannot be judged" in text and "Train 4 epochs or more" in text


def test_an_epoch_shorter_than_its_iterations_is_not_explained_by_slow_iterations():
    """The known bad case: 01 said "the difference is the slow iterations" of later epochs shorter than
    iterations x median iteration."""
    text = baseline.warmup(_run([2.0, 0.05, 0.051, 0.049], [400, 20, 15, 12, 11] + STEADY[5:]))
    assert "the slow iterations" not in text and "machine's speed changed" in text
    slow = baseline.warmup(_run([2.0, 0.2, 0.21, 0.19], [400, 20, 15, 12, 11] + STEADY[5:]))
    assert "The difference is the slow iterations" in slow


def _sweep(rows: list[tuple]) -> pd.DataFrame:
    """Sweep rows whose three rounds lie ``spread`` either side of ``rate``."""
    return pd.DataFrame([{"model": model, "batch_size": batch, "status": "ok", "parameters": params,
                          "training_gflops_per_image": gflops, "images_per_second": rate, "spread": spread,
                          "rates": [rate * (1 - spread), rate, rate * (1 + spread)],
                          "peak_memory_mib": memory, "memory_source": source}
                         for model, batch, params, gflops, rate, spread, memory, source in rows])


def test_process_memory_that_does_not_grow_is_not_explained_as_growth():
    """The known bad case: 02 printed "peak memory grew 1.0x" on a CPU and then explained why memory grows."""
    text = monitoring.batch_size_answer(_sweep([("small_cnn", 16, 1e5, 0.1, 900.0, 0.3, 512.0, "process"),
                                         ("small_cnn", 64, 1e5, 0.1, 1000.0, 0.3, 515.0, "process")]))
    assert "grew **1.0x**" not in text and "**no measurable growth**" in text
    assert "throughput changed **1.11x**" in text and "**no measurable difference**" in text
    assert "Memory grows with the batch because" not in text and "cannot show it" in text


def test_allocator_memory_that_grows_is_explained():
    text = monitoring.batch_size_answer(_sweep([("resnet18", 32, 1e7, 1.0, 1000.0, 0.02, 1000.0, "allocator"),
                                         ("resnet18", 128, 1e7, 1.0, 1500.0, 0.02, 3500.0, "allocator")]))
    assert "peak memory grew **3.5x** and throughput changed **1.50x**" in text and "**faster**" in text
    assert "Memory grows with the batch because activations are stored" in text
    assert ".." not in text  # each model's line ends with one full stop, after the speed's own sentence


def test_models_whose_speeds_differ_inside_the_spread_are_not_ranked():
    text = monitoring.model_size_answer(_sweep([("small_cnn", 64, 1e5, 0.1, 1000.0, 0.25, 1.0, "process"),
                                         ("resnet18", 64, 1e7, 1.1, 900.0, 0.25, 1.0, "process")]))
    assert "**no measurable difference**" in text
    measured = monitoring.model_size_answer(_sweep([("small_cnn", 64, 1e5, 0.1, 1000.0, 0.05, 1.0, "process"),
                                             ("resnet18", 64, 1e7, 1.1, 200.0, 0.05, 1.0, "process")]))
    assert "small_cnn's speed over its is **5.00x**" in measured and "**faster**" in measured


def test_power_is_read_against_known_levels_with_throughput_as_the_work():
    rows = _sweep([("resnet18", 32, 1e7, 1.0, 800.0, 0.02, 1.0, "allocator"),
                   ("resnet152", 128, 6e7, 20.0, 300.0, 0.02, 1.0, "allocator")]).assign(
        utilization_percent=[99.0, 100.0], power_watts=[210.0, 480.0], power_limit_watts=560.0, power_note="",
        mfu=[0.1, 0.4])
    text = monitoring.utilization_vs_power_answer(rows)
    assert "about **300 W** with one GCD busy and about **500 W** with both" in text and "**560 W**" in text
    assert "800 images/s, 10% MFU" in text and "Near the limit" not in text


def _record(folder: Path, benchmark: str, device: str) -> None:
    (folder / f"{benchmark}-{device}.json").write_text(json.dumps({
        "benchmark": benchmark, "device": device, "date": "2026-11-23", "versions": {"torch": "2.10"},
        "rows": [{"images_per_second": 1.0}]}))


def test_gpu_results_are_cited_only_where_a_gpu_recorded_them(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "results_dir", lambda: tmp_path)
    _record(tmp_path, "sweep", "CPU")
    assert reference.gpu_rows("sweep").empty and reference.gpu_rows("progression").empty
    assert "No GPU result of `sweep` is recorded" in reference.gpu_note("sweep")
    assert "python benchmarks/sweep.py" in reference.gpu_note("sweep")
    _record(tmp_path, "sweep", "AMD Instinct MI250X")
    assert list(reference.gpu_rows("sweep")["device"]) == ["AMD Instinct MI250X"]
    assert "1 rows of `sweep` (AMD Instinct MI250X)" in reference.gpu_note("sweep")


@pytest.mark.parametrize("order, done", [("clears", False), ("accumulates", True), ("empties", True)])
def test_the_zero_grad_check_names_what_the_step_does(order, done):
    check = baseline.check_zero_grad(baseline._reference_step(order))
    assert check.done == done and baseline.BEHAVIOURS[order] in check.text


def test_training_faster_than_the_model_alone_is_a_disturbed_measurement():
    from course_utils.lessons import data_loading

    table = pd.DataFrame([{"loader": "torch", "io": 3443.0, "synthetic": 37.7, "full": 46.0,
                           "full_over_synthetic": 1.22, "loading_us_per_image": -4790.7, "verdict": "compute-bound"}])
    text = data_loading.loaders_answer(table, {"workers": 2})
    assert "**disturbed measurement**" in text and "122%" in text
    assert "-4791" not in text and "compute-bound" not in text
    # Timed in blocks: FULL a little above SYNTHETIC within their spreads is noise, not a disturbance, and is read
    # as usual; wholly above them it is disturbed.
    within = {"io": [3400.0, 3443.0, 3500.0], "synthetic": [36.0, 37.7, 39.0], "full": [37.0, 38.1, 38.6]}
    read = data_loading.loaders_answer(table.assign(full=38.1, full_over_synthetic=1.01, rates=[within]), {})
    assert "disturbed" not in read and "compute-bound" in read
    above = {**within, "full": [45.0, 46.0, 47.0]}
    assert "**disturbed measurement**" in data_loading.loaders_answer(table.assign(rates=[above]), {})


def test_the_gpu_note_gives_the_rows_data_whole_and_what_a_stand_in_means():
    note = reference.gpu_note("baseline")
    assert "class patterns instead of photos (50000 train / 10000 test images, seed 0)" in note
    assert "the accuracy says nothing about CIFAR-100" in note
