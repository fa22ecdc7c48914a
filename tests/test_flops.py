"""FLOPs per image from PyTorch's own counter, and MFU against the vendors' dense peaks."""

import pytest

from course_utils.observe import flops
from course_utils.training import models


def test_training_flops_are_three_forward_passes_of_the_architecture():
    """A ResNet-50 at 224 px is 4.1 G multiply-adds forward (8.2 GFLOP); a training step is about three
    times that. Counted on the meta device: no memory, no arithmetic."""
    per_image = flops.training_flops_per_image(lambda: models.build("resnet50", image_size=224), 224)
    assert 23e9 < per_image < 26e9
    small = flops.training_flops_per_image(lambda: models.build("resnet18", image_size=32), 32)
    assert per_image / small > 5  # the same parameters' worth of layers, at 49 times the pixels


@pytest.mark.parametrize(("name", "amp", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "off", 378.0),
    ("NVIDIA A100-SXM4-40GB", "off", 156.0), ("AMD Instinct MI250X/MI250", "off", 47.85),
    ("AMD Instinct MI250X/MI250", "fp16", 191.5), ("NVIDIA H200", "bf16", 989.4),
])
def test_the_peak_follows_the_device_and_the_precision(name, amp, tflops):
    assert flops.peak_tflops(name, amp)[0] == tflops


def test_mfu_is_achieved_over_peak_and_absent_where_the_peak_is_unknown():
    assert flops.mfu(1000.0, 24.3e9, "NVIDIA A100-SXM4-80GB", "bf16") == pytest.approx(1000 * 24.3e9 / 312e12)
    assert flops.mfu(1000.0, 24.3e9, "NVIDIA A100-SXM4-80GB", "bf16", devices=4) == pytest.approx(
        1000 * 24.3e9 / (4 * 312e12))
    assert flops.mfu(1000.0, 24.3e9, "CPU", "off") is None


def test_the_answer_reads_mfu_where_there_is_a_peak_and_says_why_not_elsewhere():
    from course_utils.lessons import baseline

    summary = {"training_flops_per_image": 24.3e9, "images_per_second": 2000.0, "device": "NVIDIA A100-SXM4-40GB",
               "mfu": 2000 * 24.3e9 / 156e12, "peak_tflops": 156.0, "peak_source": "NVIDIA A100 datasheet"}
    assert "**48.6 TFLOP/s** achieved, **31%** of the 156 TFLOP/s dense peak" in baseline.work_and_peak(summary)
    cpu = baseline.work_and_peak({**summary, "device": "CPU", "mfu": None})
    assert "no MFU here: the peak of CPU is not in the course's table" in cpu


def test_an_mfu_above_one_is_a_disturbed_measurement_not_a_figure():
    from course_utils.lessons import baseline

    summary = {"training_flops_per_image": 24.3e9, "images_per_second": 9000.0, "device": "NVIDIA A100-SXM4-40GB",
               "mfu": 9000 * 24.3e9 / 156e12, "peak_tflops": 156.0, "peak_source": "NVIDIA A100 datasheet"}
    text = baseline.work_and_peak(summary)
    assert "**disturbed measurement**" in text and "not a finding" in text
