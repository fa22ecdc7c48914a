import math

import pytest
import torch

from course_utils.observe.clocks import StepClock, images_per_second, warmup_steps


def test_warmup_is_the_first_epoch_when_there_are_several():
    assert warmup_steps(steps_per_epoch=40, epochs=3, total_steps=120) == 40


def test_warmup_of_a_single_epoch_is_a_fifth():
    assert warmup_steps(steps_per_epoch=50, epochs=1, total_steps=50) == 10
    assert warmup_steps(steps_per_epoch=1, epochs=1, total_steps=1) == 0


def test_images_per_second_skips_warmup():
    assert images_per_second([5.0, 1.0, 1.0], [10, 10, 10], skip=1) == pytest.approx(10.0)
    assert math.isnan(images_per_second([1.0], [10], skip=1))


def test_cpu_clock_measures_each_lap():
    clock = StepClock(torch.device("cpu"))
    clock.start()
    for _ in range(3):
        torch.randn(200, 200) @ torch.randn(200, 200)
        clock.lap()
    laps = clock.drain()
    assert len(laps) == 3 and all(t > 0 for t in laps)
    assert clock.drain() == []
