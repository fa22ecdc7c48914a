"""An out-of-memory setting in a sweep is a data point, not a crash."""

import pytest
import torch

from course_utils.experiments import fixed_batch
from course_utils.experiments.sweep import sweep


def _impossible_allocation():
    torch.empty(2**48, dtype=torch.uint8)  # 256 TiB: the allocator refuses at once, on any machine


def test_allocation_failures_count_as_out_of_memory():
    with pytest.raises(RuntimeError) as refused:
        _impossible_allocation()
    assert fixed_batch.is_out_of_memory(refused.value)
    assert fixed_batch.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not fixed_batch.is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_a_step_that_needs_too_much_memory_is_reported_as_a_row(monkeypatch, tiny_root):
    real_step = fixed_batch.train_step

    def step_with_a_huge_activation(setup, batches, ranges):
        _impossible_allocation()
        return real_step(setup, batches, ranges)

    monkeypatch.setattr(fixed_batch, "train_step", step_with_a_huge_activation)
    table = sweep(["small_cnn"], [8, 16], steps=1, warmup=0, monitor_backend="cpu", size="ci")
    assert list(table["status"]) == ["out of memory", "out of memory"]
    assert list(table["batch_size"]) == [8, 16]
