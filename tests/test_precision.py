"""Each precision and compilation option trains, and its loss falls; what cannot run says why."""

import time

import pandas as pd
import pytest
import torch

from course_utils import devices
from course_utils.experiments import progression
from course_utils.experiments.progression import notebook_stages, unavailable
from course_utils.lessons import precision
from course_utils.observe.metrics import load_run
from course_utils.observe.noise import Measurement
from course_utils.run_folder import RunFolder
from course_utils.train import train
from course_utils.training import checkpoint

CPU = torch.device("cpu")


def _loss_falls(out) -> bool:
    losses = load_run(out).steps["loss"]
    return losses.iloc[-2:].mean() < losses.iloc[:2].mean() - 0.05


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    {"channels_last": True},
    {"fused_optimizer": True},
    {"amp": "bf16", "channels_last": True, "fused_optimizer": True},
], ids=lambda o: ",".join(o))
def test_option_trains_and_loss_falls(quick, tmp_path, options):
    summary = train(**{**quick, "out": str(tmp_path), "epochs": 3, **options})
    assert summary["config"] | options == summary["config"]
    assert _loss_falls(tmp_path)


@pytest.mark.slow
def test_fp16_on_cpu_runs_with_a_grad_scaler(quick, tmp_path):
    train(**{**quick, "out": str(tmp_path), "amp": "fp16", "batch_size": 8, "train_samples": 48, "epochs": 1})
    state = checkpoint.load(RunFolder(tmp_path).last_checkpoint)
    assert state["scaler"]["scale"] > 0  # the scaler was enabled and saved with the run


STAGES = notebook_stages()  # notebook 05's cell, as the course ships it
HALF_PRECISION_STAGES = {stage.options["amp"]: stage for stage in STAGES if stage.options.get("amp")}


@pytest.mark.parametrize("amp", HALF_PRECISION_STAGES)
@pytest.mark.parametrize("half_rate,slowdown", [(100.0, 10), (400.0, None)], ids=["much-slower", "usable"])
def test_half_precision_stage_on_cpu_is_kept_only_when_not_much_slower(monkeypatch, amp, half_rate, slowdown):
    """The probe's verdict from rates set here (fp32 at 1000 images/s), whatever this CPU is: 2.5x slower is
    within SLOWDOWN_LIMIT and still worth showing, 10x is not."""
    rates = {"off": 1000.0, amp: half_rate}
    monkeypatch.setattr(progression, "measure_setting",
                        lambda model, batch_size, amp, **options: {"images_per_second": rates[amp]})
    reason = unavailable(HALF_PRECISION_STAGES[amp], CPU, "small_cnn")
    if slowdown is None:
        assert reason is None, reason
    else:
        assert reason is not None and f"{amp} runs, but {slowdown}x slower than fp32 here (100 vs 1000" in reason


@pytest.mark.slow
def test_half_precision_probe_on_this_cpu_decides_from_what_it_measured(monkeypatch):
    """The real probe: it times fp32 and bf16 steps on this CPU, and its verdict follows those two rates."""
    measured = {}
    real = progression.measure_setting

    def recording(model, batch_size, amp, **options):
        row = real(model, batch_size, amp=amp, **options)
        measured[amp] = row["images_per_second"]
        return row

    monkeypatch.setattr(progression, "measure_setting", recording)
    reason = unavailable(HALF_PRECISION_STAGES["bf16"], CPU, "small_cnn")
    assert set(measured) == {"off", "bf16"} and min(measured.values()) > 0, measured
    if measured["bf16"] * progression.SLOWDOWN_LIMIT < measured["off"]:
        assert reason is not None and f"({measured['bf16']:.0f} vs {measured['off']:.0f} images/s" in reason
    else:
        assert reason is None, reason


def test_cuda_graphs_stage_says_why_on_cpu():
    assert "no GPU" in unavailable(STAGES[-1], CPU, "small_cnn")


def _progression(losses: list[float], top1: list[float], first: list[float], spread: float = 0.02,
                 rates: tuple[float, ...] = (100.0, 110.0, 115.0, 160.0)) -> pd.DataFrame:
    """Four stages whose steady iterations lie ``spread`` either side of ``rates``."""
    stages = ["fp32 baseline", "+ channels_last", "+ fused optimizer", "+ torch.compile"]
    measured = [Measurement.of([rate * (1 - spread), rate, rate * (1 + spread)]) for rate in rates]
    return pd.DataFrame({"stage": stages, "status": "ok", "images_per_second": list(rates),
                         "speedup": [rate / rates[0] for rate in rates], "measured": measured,
                         "mfu": [0.1] * 4, "final_train_loss": losses, "test_top1": top1, "first_iteration_s": first})


def test_same_training_is_judged_against_fixed_bars_not_asserted():
    same = precision.progression_answer(_progression([2.00, 2.02, 1.99, 2.03], [40.0, 41.0, 39.5, 40.5],
                                                     [0.5, 0.5, 0.6, 9.4]))
    assert "Same training? Yes" in same and "about **8.8 s** of it is compilation" in same
    apart = precision.progression_answer(_progression([2.00, 2.02, 2.60, 2.03], [40.0, 41.0, 30.0, 40.5],
                                                      [0.5, 0.5, 0.6, 9.4]))
    assert "Same training? Not shown" in apart and "furthest is **+ fused optimizer**" in apart


def test_energy_per_image_is_read_where_power_was_measured_and_its_absence_said():
    unmeasured = precision.progression_answer(_progression([2.0] * 4, [40.0] * 4, [0.5] * 4))
    assert "**Energy**: not measured here: this device reports no power" in unmeasured
    measured = _progression([2.0] * 4, [40.0] * 4, [0.5] * 4).assign(joules_per_image=[0.8, 0.75, 0.7, 0.5])
    assert "**0.500 J** per image at the fastest stage against **0.800 J** in fp32 (1.60x less)" in \
        precision.progression_answer(measured)


def test_a_stage_inside_its_spread_is_no_measurable_difference():
    """Stages 10 % apart whose iterations spread by 30 % are not ranked; a 1.39x gain past both spreads is."""
    noisy = precision.progression_answer(_progression([2.0] * 4, [40.0] * 4, [0.5] * 4, spread=0.12))
    lines = noisy.splitlines()
    assert "**+ channels_last**" in lines[1] and "**no measurable difference**" in lines[1]
    assert "**+ torch.compile**" in lines[3] and "**1.39x**" in lines[3] and "**faster**" in lines[3]
    assert "Fastest: **+ torch.compile** at **1.60x**" in noisy
    flat = _progression([2.0] * 4, [40.0] * 4, [0.5] * 4, spread=0.10, rates=(100.0, 104.0, 97.0, 108.0))
    assert "No stage is measurably faster than the fp32 baseline" in precision.progression_answer(flat)


def test_an_mfu_above_one_is_a_disturbed_measurement():
    impossible = _progression([2.0] * 4, [40.0] * 4, [0.5] * 4).assign(mfu=[0.1, 0.2, 0.3, 1.4])
    assert "MFU of 1.40, above 1" in precision.progression_answer(impossible)
    assert "above 1" not in precision.progression_answer(_progression([2.0] * 4, [40.0] * 4, [0.5] * 4))


def test_the_underflow_check_tells_a_scaled_backward_pass_from_an_unscaled_one():
    def unscaled(model, images, labels):
        model.zero_grad(set_to_none=True)
        with torch.autocast(images.device.type, dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        return [parameter.grad for parameter in model.parameters()]

    assert not precision.check_underflow(precision.scaled_fp16_gradients).done
    dropped = precision.check_underflow(unscaled)
    assert dropped.done and "underflowed" in str(dropped)


def test_the_recorded_h100_progression_is_read_as_launch_bound_only_from_its_rounds():
    """The H100 recording (2 rounds per stage): only CUDA graphs were faster than fp32 in every round, at an fp32
    MFU of 0.09; two rounds give no spread, and the reading says so instead of calling anything measured."""
    from course_utils.experiments import reference

    text = precision.recorded_reading(reference.gpu_rows("progression"))
    assert "Measurably faster than fp32: no stage" in text and "2 rounds are too few for a spread" in text
    assert "CUDA graphs" in text.split("too few for a spread:")[1].split(";")[0] and "**launch-bound**" in text


def test_a_recorded_progression_with_every_round_kept_is_read_through_its_spread():
    def stage(name, rates, mfu=0.5):
        return {"device": "GPU", "date": "2026-11-26", "model": "resnet50", "batch_size": 128, "rounds": len(rates),
                "stage": name, "status": "ok", "images_per_second": sorted(rates)[1], "mfu": mfu, "rates": rates}
    rows = pd.DataFrame([stage("fp32 baseline", [1000, 1010, 990]), stage("+ AMP bf16", [2500, 2450, 2550]),
                         stage("+ channels_last", [1005, 980, 1020])])
    text = precision.recorded_reading(rows)
    assert "Measurably faster than fp32: + AMP bf16" in text and "not shown faster: + channels_last" in text
    assert "launch-bound" not in text


def test_a_side_stage_is_left_out_of_the_stages_after_it_and_untimed_stages_lend_their_options(monkeypatch):
    monkeypatch.setattr(progression, "unavailable", lambda stage, device, model: None)  # as on a GPU
    ran = list(progression._stages_to_run(STAGES, CPU, "small_cnn", only={"+ torch.compile",
                                                                     "fp16 + GradScaler instead of bf16"}))
    (fp16, fp16_options, fp16_base, _), (compiled, options, base, _) = ran
    assert fp16_options == {"amp": "fp16", "channels_last": True, "fused_optimizer": True}
    assert fp16_base == base == "+ fused optimizer"  # both build on the fused stage; the compile stage keeps bf16
    assert options == {"amp": "bf16", "channels_last": True, "fused_optimizer": True, "compile": "default"}


def _ladder(rates: dict[str, float], strict_status: str = "ok") -> pd.DataFrame:
    builds_on = {progression.STRICT: None, progression.BASELINE: None, "+ bf16 autocast": progression.BASELINE,
                 "+ channels_last": "+ bf16 autocast", "+ fused optimizer": "+ channels_last",
                 "fp16 + GradScaler instead of bf16": "+ fused optimizer", "+ torch.compile": "+ fused optimizer",
                 "+ CUDA graphs (compile reduce-overhead)": "+ torch.compile"}
    rows = [{"stage": stage, "status": strict_status if stage == progression.STRICT else "ok",
             "images_per_second": rate, "builds_on": builds_on[stage],
             "options": "amp=bf16" if "fp32" not in stage else "defaults",
             "rates": [rate * 0.99, rate, rate * 1.01]} for stage, rate in rates.items()]
    return pd.DataFrame(rows)


def test_the_goals_follow_the_image_size_and_the_devices_fp32():
    tf32 = _ladder({progression.STRICT: 400.0, progression.BASELINE: 1800.0, "+ bf16 autocast": 3000.0,
                    "+ fused optimizer": 3800.0})
    first, second = progression.progression_goals(tf32, 224)
    assert first.value == pytest.approx(3800 / 1800) and first.met and "2.0x" in first.goal
    assert second.value == pytest.approx(9.5) and second.met and "NVIDIA" in second.source
    no_tf32 = _ladder({progression.STRICT: 0.0, progression.BASELINE: 1000.0, "+ bf16 autocast": 2500.0},
                      strict_status="not available on AMD Instinct MI250X: no TF32 here")
    (only,) = progression.progression_goals(no_tf32, 224)
    assert "strict fp32 here" in only.figure and only.value == pytest.approx(2.5) and only.met is False
    launch_bound = _ladder({progression.BASELINE: 12000.0, "+ fused optimizer": 12500.0, "+ torch.compile": 13000.0,
                            "+ CUDA graphs (compile reduce-overhead)": 27000.0})
    (graphs,) = progression.progression_goals(launch_bound, 32)
    assert graphs.value == pytest.approx(27000 / 13000) and graphs.met
    (untimed,) = progression.progression_goals(launch_bound.iloc[:2], 32)
    assert untimed.value is None and untimed.met is None


def test_each_stage_is_read_against_the_stage_it_builds_on_and_tf32_against_strict_fp32():
    ladder = _ladder({progression.STRICT: 400.0, progression.BASELINE: 1800.0, "+ bf16 autocast": 3000.0,
                      "+ channels_last": 3300.0, "+ fused optimizer": 3600.0,
                      "fp16 + GradScaler instead of bf16": 3650.0, "+ torch.compile": 4200.0})
    ladder["measured"] = [Measurement.of(rates) for rates in ladder["rates"]]
    ladder = ladder.assign(mfu=0.1, final_train_loss=2.0, test_top1=40.0, first_iteration_s=1.0)
    text = precision.progression_answer(ladder)
    assert "**fp32 baseline** (PyTorch's default: convolutions in TF32) against **fp32, strict (no TF32)**: " \
           "**4.50x**" in text
    assert "**+ torch.compile** (4200 images/s" in text and "against **+ fused optimizer**: **1.17x**" in text
    assert "**fp16 + GradScaler instead of bf16** (3650 images/s" in text
    assert "Fastest: **+ torch.compile** at **2.33x** the fp32 baseline" in text


def test_strict_fp32_holds_inside_its_block_only():
    before = torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    with devices.strict_fp32():
        assert not devices.tf32_convolutions() and torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision) == before
    assert devices.tf32_convolutions()


def test_the_learners_rounds_and_the_courses_alternate():
    """Between two of the learner's rounds a whole round of the course's step ran: the gap between the learner's
    calls is at least that round's time, so a change of load between the two cells cannot pass for a difference."""
    called: list[float] = []

    def mine() -> float:
        called.append(time.perf_counter())
        return 100.0

    steps, batch = 3, 8
    yours, course = precision.interleaved_rates(mine, "small_cnn", batch, "off", steps)
    assert yours == [100.0] * 3 and len(course) == 3
    gaps = [later - earlier for earlier, later in zip(called, called[1:])]
    assert all(gap >= 0.9 * steps * batch / rate for gap, rate in zip(gaps, course)), (gaps, course)
