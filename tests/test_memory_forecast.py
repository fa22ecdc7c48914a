"""Notebook 12's memory forecast: a step's memory by kind, predicted on the meta device, against the memory the
same step really holds (in this process, and on DDP and FSDP ranks of the training command)."""

import pytest
import torch

from course_utils.lessons import memory_forecast
from course_utils.observe.memory import KINDS

RUN = dict(size="ci", model="small_cnn", batch_size=16)


@pytest.mark.oldest
@pytest.mark.parametrize("recomputed", [False, True])
def test_the_forecast_is_what_the_step_holds_once_it_ran(recomputed):
    predicted = memory_forecast.predict_step(**RUN, activation_checkpointing=recomputed)
    measured = memory_forecast.measure_steps(steps=2, **RUN, activation_checkpointing=recomputed)
    after = measured.iloc[-1]
    assert {kind: round(after[kind] * memory_forecast.MIB) for kind in KINDS} == predicted
    before = measured.iloc[0]
    assert before["gradients"] == 0 and before["optimizer_state"] == 0  # created by the first step
    assert before["parameters"] * memory_forecast.MIB == predicted["parameters"]


def test_checkpointing_saves_fewer_activations_and_the_gap_answer_reads_the_figures():
    plain = memory_forecast.predict_step(**RUN)
    recomputed = memory_forecast.predict_step(**RUN, activation_checkpointing=True)
    assert recomputed["activations"] < plain["activations"]
    measured = memory_forecast.measure_steps(steps=1, **RUN)
    text = memory_forecast.gap_answer(memory_forecast.forecast_against_measurement(plain, measured), measured)
    assert f"{plain['activations'] / memory_forecast.MIB:.2f} MiB" in text and "the same" in text
    assert "they differ" not in text and "at the first step" in text


def test_the_cheapest_rung_that_fits_the_budget():
    table, chosen = memory_forecast.fitting_rung(1e6, ranks=2, **RUN)
    assert chosen == "one process" and "the first rung fits" in memory_forecast.rung_answer(table, chosen, 1e6)
    totals = table.set_index("rung")["total_mib"]
    between = (totals["FSDP"] + totals["FSDP + activation checkpointing"]) / 2
    table, chosen = memory_forecast.fitting_rung(between, ranks=2, **RUN)
    assert chosen == "FSDP + activation checkpointing"
    assert "FSDP (" in memory_forecast.rung_answer(table, chosen, between)
    table, chosen = memory_forecast.fitting_rung(0.1, ranks=2, **RUN)
    assert chosen is None and "No rung fits" in memory_forecast.rung_answer(table, chosen, 0.1)
    assert "offload" not in " ".join(table["rung"])  # it needs GPUs; these ranks are CPU processes


def test_what_the_forecast_does_not_model_is_refused_by_name():
    with pytest.raises(ValueError, match="amp"):
        memory_forecast.predict_step(**RUN, amp="bf16")
    with pytest.raises(ValueError, match="distributed=dp"):  # DataParallel: GPU 0 holds more than the others
        memory_forecast.predict_step(**RUN, distributed="dp")
    with pytest.raises(TypeError, match="valid"):
        memory_forecast.predict_step(**RUN, batchsize=8)
    with pytest.raises(ValueError, match="training command"):
        memory_forecast.measure_steps(**RUN, distributed="fsdp")


@pytest.mark.parametrize(("wrong", "error", "told"), [
    ({"ranks": 0}, ValueError, "ranks is the number of processes the step is spread over: at least 1, not 0"),
    ({"ranks": -2}, ValueError, "at least 1, not -2"),
    ({"ranks": 2.0}, TypeError, r"ranks takes a whole number \(an int\), not 2.0 \(a float\)"),
    ({"batch_size": "8"}, TypeError, r"batch_size takes a whole number \(an int\), not '8' \(a str\)"),
    ({"lr": "0.1"}, TypeError, r"lr takes a number \(an int or a float\), not '0.1'"),
])
def test_a_count_that_is_no_count_is_refused_by_name_not_divided_by(wrong, error, told):
    """Zero ranks divided by zero, negative ranks gave negative bytes, a batch size as text a comparison's
    TypeError: each is named with what it takes."""
    with pytest.raises(error, match=told):
        memory_forecast.predict_step(**{**RUN, "distributed": "fsdp", **wrong})


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_the_forecast_per_rank_is_what_the_training_commands_ranks_measured(mode, request):
    """The session's DDP and FSDP runs of the training command (conftest.py), each rank's step as it measured it."""
    summary = request.getfixturevalue(f"{mode}_run")[0].summary
    predicted = memory_forecast.predict_step(ranks=2, distributed=mode, size="ci", model="small_cnn_gn",
                                             batch_size=16)
    for rank in summary["per_rank"]:
        assert {kind: rank["step_memory_bytes"][kind] for kind in KINDS} == predicted


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the caching allocator and its memory history need a GPU")
def test_on_a_gpu_the_allocator_is_read_and_its_history_written(tmp_path):
    snapshot = tmp_path / "snapshot.pickle"
    measured = memory_forecast.measure_steps(steps=3, device="cuda", snapshot=snapshot, **RUN)
    after = measured.iloc[-1]
    assert snapshot.stat().st_size > 0
    assert after["reserved_mib"] >= after["allocated_mib"] > 0
    assert after["peak_allocated_mib"] >= sum(after[kind] for kind in KINDS) * 0.99
    text = memory_forecast.gap_answer(memory_forecast.forecast_against_measurement(
        memory_forecast.predict_step(**RUN), measured), measured)
    assert "caching allocator reserved" in text and "The first step peaked" in text
