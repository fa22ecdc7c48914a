"""How much of a step is communication and how much hid behind computation, from Chrome traces in the
profiler's format: a CPU (gloo) trace and a GPU (NCCL kernels) trace with known overlaps."""

import json

import pytest

from course_utils.observe import communication


def _event(name, ts, dur, tid=1, cat="user_annotation"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat}


def _per_step(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return communication.per_step(path).iloc[0]


def test_gloo_overlaps_only_the_operators_the_training_thread_really_ran(tmp_path):
    row = _per_step(tmp_path, [
        _event("ProfilerStep#3", 0, 100),
        _event("backward", 10, 70),  # a range, not work: it also holds the wait for the all-reduce
        _event("autograd::engine::evaluate_function: ConvolutionBackward0", 10, 40, cat="cpu_op"),
        _event("aten::convolution_backward", 12, 36, cat="cpu_op"),
        _event("autograd::engine::evaluate_function: AccumulateGrad", 50, 30, cat="cpu_op"),  # waits inside
        _event("aten::add_", 50, 5, cat="cpu_op"),
        _event("c10d::allreduce_", 40, 1, cat="cpu_op"),
        _event("gloo:all_reduce", 40, 30, tid=2),
    ])
    assert row["step_ms"] == pytest.approx(0.1) and row["communication_ms"] == pytest.approx(0.03)
    # The all-reduce ran 40-70; the work beside it: the convolution's backward to 48, the add 50-55.
    assert row["hidden_ms"] == pytest.approx(0.013) and row["exposed_ms"] == pytest.approx(0.017)
    assert row["communication_percent"] == pytest.approx(30)


def test_nccl_kernels_overlap_the_compute_kernels_on_the_device(tmp_path):
    row = _per_step(tmp_path, [
        _event("ProfilerStep#3", 0, 1000),
        _event("nccl:all_reduce", 300, 5, cat="cpu_op"),
        _event("void cudnn::engine_convolution_backward(...)", 100, 500, tid=7, cat="kernel"),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 400, 300, tid=8,
               cat="kernel"),
    ])
    assert row["communication_ms"] == pytest.approx(0.3)
    assert row["hidden_ms"] == pytest.approx(0.2) and row["exposed_ms"] == pytest.approx(0.1)
