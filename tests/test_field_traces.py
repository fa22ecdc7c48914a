"""The course's trace readers on real GPU traces from the field (HolisticTraceAnalysis's test data: NVIDIA runs
with NCCL kernels and DDP, and a ROCm run on an MI250; sources in tests/fixtures/README.md), checked against
HolisticTraceAnalysis itself where it computes the same figure."""

import gzip
import json
from pathlib import Path

import matplotlib
import pytest

from course_utils.observe import communication, profiling, trace_timeline

matplotlib.use("Agg")

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
NVIDIA = ("hta_16ranks_rank0_cut.json.gz", "hta_ddp_2ranks_rank0.json.gz", "hta_128ranks_rank0.json.gz",
          "hta_128ranks_rank1.json.gz")


def _nccl_kernels(trace: Path) -> list[dict]:
    return [e for e in profiling.trace_events(trace) if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]


def test_gzipped_traces_read_as_their_plain_copies(tmp_path):
    for name in ("hta_mi250_rocm6.2.json.gz", "hta_128ranks_rank0.json.gz"):
        plain = tmp_path / name.removesuffix(".gz")
        plain.write_bytes(gzip.decompress((FIXTURES / name).read_bytes()))
        assert profiling.trace_events(FIXTURES / name) == profiling.trace_events(plain) != []


def test_a_rocm_trace_gives_its_steps_and_its_timeline():
    trace = FIXTURES / "hta_mi250_rocm6.2.json.gz"
    table = communication.per_step(trace)
    assert len(table) == 2 and (table["communication_ms"] == 0).all()  # one GPU: no RCCL kernels
    spans = trace_timeline.read_spans(trace)
    assert set(spans["kind"]) >= {"iteration", "kernel"}
    assert trace_timeline.draw(trace).axes[0].get_title(loc="left") == "The recorded iterations: 2 steps"


@pytest.mark.parametrize("name", NVIDIA)
def test_every_nccl_kernel_counts_in_the_step_that_launched_it(name):
    """The kernels run after the host has moved on: cut by the host's step windows, the 16-rank trace's
    all-reduces landed in later steps and some in none. Each counts once, in its launching step, except those
    launched outside the recorded steps (before the record began their launch is not even in the trace)."""
    trace = FIXTURES / name
    events = profiling.trace_events(trace)
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in communication.host_steps(events))
    launches = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    expected = []
    for start, end in steps:
        mine = [e for e in _nccl_kernels(trace) if start <= launches.get(e["args"]["correlation"], -1) < end]
        busy = sorted((e["ts"], e["ts"] + e["dur"]) for e in mine)
        merged = []  # the time the device spent in them: kernels on two streams may overlap
        for a, b in busy:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        expected.append(sum(b - a for a, b in merged) / 1000)
    assert list(communication.per_step(trace)["communication_ms"]) == pytest.approx(expected)


def test_the_last_step_keeps_its_all_reduce():
    table = communication.per_step(FIXTURES / "hta_16ranks_rank0_cut.json.gz")
    assert [round(ms, 1) for ms in table["communication_ms"]] == [31.7, 36.2, 30.9, 37.8, 26.6]


def test_dataparallel_phases_count_the_device_copies_each_step_launched():
    trace = FIXTURES / "hta_16ranks_rank0_cut.json.gz"
    copies = communication.dataparallel_phases(trace)["gpu_copies_ms"]
    assert (copies >= communication.per_step(trace)["communication_ms"] - 1e-9).all()
    assert copies.iloc[-1] > 26.6  # the last step's all-reduce and its copies


@pytest.mark.slow  # HTA parses each trace in tens of seconds on a small machine
@pytest.mark.parametrize("names", [("hta_16ranks_rank0_cut.json.gz",), ("hta_ddp_2ranks_rank0.json.gz",),
                                   ("hta_128ranks_rank0.json.gz", "hta_128ranks_rank1.json.gz")])
def test_the_hidden_share_of_communication_agrees_with_holistic_trace_analysis(names, tmp_path):
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is the test extra's traceinsight: pip install -e .[test]")
    for name in names:
        (tmp_path / name).write_bytes((FIXTURES / name).read_bytes())
    by_hta = communication.overlap_by_hta(tmp_path).set_index("rank")["overlap_percent"]
    for name in names:
        rank = json.loads(gzip.decompress((FIXTURES / name).read_bytes()))["distributedInfo"]["rank"]
        table = communication.per_step(FIXTURES / name)
        ours = 100 * table["hidden_ms"].sum() / table["communication_ms"].sum()
        # HTA rounds nanosecond times down to whole microseconds (the DDP trace has them): half a point apart
        assert ours == pytest.approx(by_hta[rank], abs=0.6 if "ddp" in name else 0.05)


def test_the_bytes_the_host_handed_to_nccl_are_what_the_kernels_moved():
    """A recent trace records each collective twice, on the host's call and on its NCCL kernel: the bytes read
    from the calls, step by step, are the kernels' element counts of the same steps."""
    trace = FIXTURES / "hta_ddp_2ranks_rank0.json.gz"
    events = profiling.trace_events(trace)
    steps = communication.host_steps(events)
    by_kernels = [sum(e["args"]["In msg nelems"] * communication.ELEMENT_BYTES[e["args"]["dtype"]] for e in work
                      if "nccl" in e["name"].lower())
                  for work in communication.device_work_by_step(events, steps)]
    assert communication.collective_bytes(trace) == by_kernels
    assert min(by_kernels) > 0


def test_the_bytes_of_an_older_trace_come_from_its_nccl_ranges():
    """The 16-rank trace (no per-call records) gives the same bytes in each of its steps: the same model, the
    same collectives, whatever each step's timing."""
    per_step = communication.collective_bytes(FIXTURES / "hta_16ranks_rank0_cut.json.gz")
    assert len(per_step) == 5 and min(per_step) > 1e9
    assert max(per_step) / min(per_step) < 1.001
