"""How much of a step is communication and how much hid behind computation, from Chrome traces in the
profiler's format: a CPU (gloo) trace and a GPU (NCCL kernels) trace with known overlaps; DataParallel's
phases from a real profiler trace."""

import json
import time

import pandas as pd
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

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


def test_the_device_side_copies_of_the_ranges_are_neither_steps_nor_phases(tmp_path):
    """A GPU trace repeats every range on the stream, late by the host's lead: step N's copy overlaps step N+1,
    which would merge the steps; DataParallel's weights and gradients move by NCCL kernels and copies."""
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [
        _event("ProfilerStep#3", 0, 1000), _event("ProfilerStep#4", 1000, 1000),
        _event("ProfilerStep#3", 400, 1000, tid=7, cat="gpu_user_annotation"),
        _event("ProfilerStep#4", 1400, 1000, tid=7, cat="gpu_user_annotation"),
        _event("DataParallel.replicate", 100, 200), _event("DataParallel.replicate", 1100, 200),
        _event("DataParallel.replicate", 500, 200, tid=7, cat="gpu_user_annotation"),
        _event("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 520, 150, tid=7, cat="kernel"),
        _event("Memcpy PtoP (Device -> Device)", 800, 50, tid=7, cat="gpu_memcpy"),
    ]}))
    assert list(communication.per_step(path)["step_ms"]) == [1.0, 1.0]
    phases = communication.dataparallel_phases(path)
    assert list(phases["step_ms"]) == [1.0, 1.0] and list(phases["replicate_ms"]) == [0.2, 0.2]
    assert phases["gpu_copies_ms"][0] == pytest.approx(0.2) and phases["gpu_copies_ms"][1] == 0


class Broadcast(torch.autograd.Function):
    """Named as DataParallel's replicate step is: its backward node is ``BroadcastBackward`` in a trace."""

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.004)
        return grad


def test_dataparallel_phases_are_read_from_a_real_profiler_trace(tmp_path):
    """Two profiled steps with DataParallel's ranges and a ``BroadcastBackward`` node, as its runs record them."""
    trace = tmp_path / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda done: done.export_chrome_trace(str(trace))) as profiler:
        for _ in range(3):
            with record_function("DataParallel.scatter"):
                time.sleep(0.003)
            with record_function("DataParallel.replicate"):
                time.sleep(0.002)
            Broadcast.apply(torch.ones(3, requires_grad=True)).sum().backward()
            profiler.step()
    table = communication.dataparallel_phases(trace)
    assert len(table) == 2
    assert (table["scatter_ms"] >= 3).all() and (table["replicate_ms"] >= 2).all()
    assert (table["reduce_gradients_ms"] >= 4).all() and (table["gather_ms"] == 0).all()
    assert (table["gpu_copies_ms"] == 0).all() and (table["step_ms"] >= 9).all()


def test_the_dataparallel_answer_reads_the_phases_or_says_what_they_would_show():
    from course_utils.lessons.dataparallel import dataparallel_phases_answer

    assert "no scatter, replicate or gather to profile" in dataparallel_phases_answer(None, 1)
    phases = pd.DataFrame({"phase": ["scatter", "replicate", "parallel_apply", "gather", "reduce_gradients",
                                     "scatter_gradients", "gpu_copies", "whole step"],
                           "ms": [1.0, 4.0, 20.0, 1.0, 3.0, 1.0, 6.0, 50.0]})
    text = dataparallel_phases_answer(phases, 4)
    assert "took **50.0 ms**" in text and "**10.0 ms, 20 %**" in text and "copying 6.0 ms" not in text


def test_with_fewer_than_two_gpus_there_is_no_dataparallel_profile(monkeypatch, tmp_path):
    from course_utils.lessons import dataparallel

    monkeypatch.setattr(dataparallel, "gpu_count", lambda: 1)
    assert dataparallel.dataparallel_profile(out=tmp_path) is None and not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more visible GPUs")
def test_dataparallel_on_two_gpus_spends_time_replicating_and_copying(quick):
    from course_utils.lessons import dataparallel

    phases = dataparallel.dataparallel_profile(steps=6, **{**quick, "device": "auto", "epochs": 1})
    ms = dict(zip(phases["phase"], phases["ms"]))
    assert ms["replicate"] > 0 and ms["scatter"] > 0 and ms["gather"] > 0 and ms["gpu_copies"] > 0
    assert ms["reduce_gradients"] > 0 and ms["whole step"] > ms["replicate"]
