import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from course_utils.lessons import profiling as lesson
from course_utils.observe.profiling import (
    PHASES,
    Ranges,
    TraceSchedule,
    device_ms_by_phase,
    phase_split,
    read_tables,
    top_operators,
    trace_events,
)
from course_utils.train import train

TRACES = Path(__file__).parent / "fixtures" / "traces"


@pytest.fixture(scope="module")
def traced(tiny_root, tmp_path_factory):
    base = tmp_path_factory.mktemp("traced")
    train(size="ci", data_dir=str(tiny_root), train_samples=320, test_samples=32, batch_size=32, epochs=1,
          workers=0, out=str(base / "run"), trace=str(base / "trace"), progress=False, device="cpu")
    return base / "trace"


@pytest.mark.oldest
@pytest.mark.slow
def test_trace_is_chrome_json_with_the_named_ranges(traced):
    trace = json.loads((traced / "trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert set(PHASES) <= names
    assert any(event.get("cat") == "cpu_op" for event in trace["traceEvents"])


@pytest.mark.slow
def test_tensorboard_plugin_copy_and_tables(traced):
    assert len(list((traced / "tensorboard").glob("*.pt.trace.json"))) == 1
    operators, phases = read_tables(traced)
    assert list(phases["phase"]) == list(PHASES)
    assert phases["host_share_percent"].sum() == pytest.approx(100)
    assert phases["device_share_percent"].isna().all()  # a CPU run has one clock
    assert operators["operator"].str.startswith("aten::").any()


def test_missing_tables_name_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--trace"):
        read_tables(tmp_path)


def test_schedule_fits_short_runs():
    assert TraceSchedule(5, 2, 5).fitted(100) == TraceSchedule(5, 2, 5)
    assert TraceSchedule(5, 2, 5).fitted(6) == TraceSchedule(0, 1, 5)
    assert TraceSchedule(5, 2, 5).fitted(1) == TraceSchedule(0, 0, 1)


def _recorded_names(ranges: Ranges) -> set[str]:
    """The event names a CPU profiler records around one range of ``ranges``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with ranges("forward"):
            torch.ones(4) + 1
    return {event.name for event in profiler.events()}


def test_ranges_are_recorded_only_when_enabled():
    """Disabled ranges cost nothing in the loop: the profiler sees the work, but no range around it."""
    assert "forward" in _recorded_names(Ranges(enabled=True))
    names = _recorded_names(Ranges(enabled=False))
    assert "forward" not in names and "aten::add" in names


def _gpu_phases(host: list[float], device: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"phase": list(PHASES), "host_share_percent": host, "device_share_percent": device})


def test_an_input_bound_gpu_run_is_caught_on_the_host_clock():
    """Waiting for a batch launches no kernel: the device clock shows compute, the host clock the wait."""
    text = lesson.phase_answer(_gpu_phases([70, 10, 15, 5], [0.5, 33, 62, 4.5]), "cuda")
    assert "largest phase on the host clock is `data`" in text and "Device clock" in text


def test_a_compute_bound_gpu_run_reads_the_device_clock():
    text = lesson.phase_answer(_gpu_phases([5, 20, 60, 15], [0.5, 33, 62, 4.5]), "cuda")
    assert "largest phase on the device clock is `backward`" in text
    cpu = lesson.phase_answer(_gpu_phases([5, 20, 60, 15], [float("nan")] * 4), "cpu")
    assert "Device clock" not in cpu and "largest phase on the host clock is `backward`" in cpu


@pytest.mark.slow
def test_the_recorded_trace_draws_as_a_timeline_whose_labels_do_not_overlap(traced):
    import matplotlib.pyplot as plt

    from course_utils.observe import trace_timeline

    spans = trace_timeline.read_spans(traced / "trace.json")
    iterations = spans[spans["kind"] == "iteration"]
    assert len(iterations) == 5 and spans["start_ms"].min() >= 0  # the schedule's active steps, from the first
    phases = spans[spans["kind"] == "phase"]
    assert list(phases["name"][:4]) == list(PHASES) and len(phases) == 4 * len(iterations)
    for step in iterations.itertuples():  # every phase lies inside its iteration
        inside = phases[(phases["start_ms"] >= step.start_ms) & (phases["end_ms"] <= step.end_ms)]
        assert list(inside["name"]) == list(PHASES)
    fig = trace_timeline.draw(traced / "trace.json")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [text.get_window_extent(renderer) for text in fig.axes[0].texts]
    assert len(labels) >= 3  # the wide spans are named
    assert not [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:] if a.overlaps(b)]
    plt.close(fig)


def test_a_missing_trace_says_how_to_record_one(tmp_path):
    from course_utils.observe import trace_timeline

    with pytest.raises(FileNotFoundError, match="trace="):
        trace_timeline.read_spans(tmp_path / "trace.json")


def test_a_gpu_trace_gets_a_row_per_device_stream(tmp_path):
    """The events a GPU run adds, in the form torch.profiler exports them: the ranges again on the device
    (gpu_user_annotation) and the kernels, both under the device's id (pid) and stream (tid)."""
    import matplotlib.pyplot as plt

    from course_utils.observe import trace_timeline

    host = {"ph": "X", "pid": 4242, "tid": 4242}
    device = {"ph": "X", "pid": 0, "tid": 7}
    events = [{**host, "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 1000.0, "dur": 900.0},
              {**host, "cat": "user_annotation", "name": "forward", "ts": 1100.0, "dur": 300.0},
              {**host, "cat": "cpu_op", "name": "aten::conv2d", "ts": 1110.0, "dur": 50.0},
              {**device, "cat": "gpu_user_annotation", "name": "forward", "ts": 1150.0, "dur": 320.0},
              {**device, "cat": "kernel", "name": "void implicit_convolve_sgemm", "ts": 1160.0, "dur": 80.0},
              {"ph": "M", "pid": 0, "tid": 7, "name": "thread_name", "args": {"name": "stream 7"}}]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    spans = trace_timeline.read_spans(tmp_path / "trace.json")
    assert set(spans["row"]) == {"host thread 4242: iterations", "host thread 4242: phases",
                                 "device 0 stream 7: phases", "device 0 stream 7: kernels"}
    kernel = spans[spans["kind"] == "kernel"].iloc[0]
    assert (kernel["start_ms"], kernel["end_ms"]) == (pytest.approx(0.16), pytest.approx(0.24))
    plt.close(trace_timeline.draw(tmp_path / "trace.json"))


class _WithDeviceCopies:
    """A CPU profile as a GPU one reads: each range also listed on the device (``gpu_user_annotation``, no
    host time), and a kernel beside the operators, as key_averages() gives them with CUDA activity."""

    def __init__(self, prof: profile) -> None:
        self.events = list(prof.key_averages())
        for event in list(self.events):
            if event.key in PHASES or event.key == "aten::mm":
                device_side = copy.copy(event)
                device_side.device_type, device_side.cpu_time_total, device_side.self_cpu_time_total = (
                    DeviceType.CUDA, 0.0, 0.0)
                device_side.key = event.key if event.key in PHASES else "void gemm_kernel<float>"
                self.events.append(device_side)

    def key_averages(self) -> list:
        return self.events


def test_the_device_side_copy_of_a_range_leaves_the_host_clock_alone(tmp_path):
    """On a GPU the profiler keeps each range twice, on the host and on the device: the phase table reads the
    host's, and the operator table lists operators, not kernels."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for name in PHASES:
            with record_function(name):
                torch.ones(64, 64) @ torch.ones(64, 64)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    gpu_like = _WithDeviceCopies(prof)
    phases = phase_split(gpu_like, tmp_path / "trace.json")
    assert list(phases["phase"]) == list(PHASES) and (phases["cpu_ms"] > 0).all()
    assert phases["host_share_percent"].sum() == pytest.approx(100)
    assert phases.equals(phase_split(prof, tmp_path / "trace.json"))
    assert "void gemm_kernel<float>" not in set(top_operators(gpu_like)["operator"])


def test_the_backward_pass_gets_the_kernels_autograd_launches_from_its_own_thread():
    """A real GPU trace (HolisticTraceAnalysis's test data: DDP on two GPUs, its ranges named ``## forward ##``,
    ``## backward ##`` and ``## optimizer ##`` on the main thread): the backward pass's kernels are launched from
    autograd's thread, so counting the kernels of the range's own thread would give the backward pass 0.06 ms of
    its 122. Counted by the launch's time, every kernel, copy and fill lands in the phase that launched it."""
    events = trace_events(TRACES / "hta_ddp_2ranks_rank0.json.gz")
    names = ("## forward ##", "## backward ##", "## optimizer ##")
    device = device_ms_by_phase(events, names)
    assert device["## backward ##"] == pytest.approx(124.34, abs=0.01)  # its all-reduce kernels included
    assert device["## forward ##"] == pytest.approx(38.77, abs=0.01)
    assert device["## optimizer ##"] == pytest.approx(2.08, abs=0.01)
    work = sum(e["dur"] for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")) / 1000
    assert sum(device.values()) == pytest.approx(work, rel=1e-3)  # the three ranges cover the profiled steps
    main_thread = {e["tid"] for e in events if e.get("cat") == "user_annotation" and e["name"] in names}
    autograd = {e["tid"] for e in events if e.get("cat") == "cpu_op" and "Backward" in e["name"]}
    assert len(main_thread) == 1 and autograd and not autograd & main_thread
