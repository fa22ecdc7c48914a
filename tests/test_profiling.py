import json

import pytest

from course_utils.profiling import PHASES, Ranges, TraceSchedule, read_tables
from course_utils.train import train


@pytest.fixture(scope="module")
def traced(tiny_root, tmp_path_factory):
    base = tmp_path_factory.mktemp("traced")
    train(size="ci", data_dir=str(tiny_root), train_samples=320, test_samples=32, batch_size=32, epochs=1,
          workers=0, out=str(base / "run"), trace=str(base / "trace"), progress=False, device="cpu")
    return base / "trace"


def test_trace_is_chrome_json_with_the_named_ranges(traced):
    trace = json.loads((traced / "trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert set(PHASES) <= names
    assert any(event.get("cat") == "cpu_op" for event in trace["traceEvents"])


def test_tensorboard_plugin_copy_and_tables(traced):
    assert len(list((traced / "tensorboard").glob("*.pt.trace.json"))) == 1
    operators, phases = read_tables(traced)
    assert list(phases["phase"]) == list(PHASES)
    assert phases["share_percent"].sum() == pytest.approx(100)
    assert operators["operator"].str.startswith("aten::").any()


def test_missing_tables_name_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--trace"):
        read_tables(tmp_path)


def test_schedule_fits_short_runs():
    assert TraceSchedule(5, 2, 5).fitted(100) == TraceSchedule(5, 2, 5)
    assert TraceSchedule(5, 2, 5).fitted(6) == TraceSchedule(0, 1, 5)
    assert TraceSchedule(5, 2, 5).fitted(1) == TraceSchedule(0, 0, 1)


def test_disabled_ranges_do_nothing():
    ranges = Ranges(enabled=False)
    with ranges("forward"):
        value = 1
    assert value == 1
