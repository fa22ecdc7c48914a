"""The answers and checks of notebooks 06-09 on noisy and contradictory measurements, and the exercise cells."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from course_utils.experiments import reference
from course_utils.lessons import ddp, memory_ladder
from course_utils.lessons.script_record import read_record
from course_utils.observe.noise import Measurement
from course_utils.parallel.launch import launch

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _measured(rate: float, spread: float = 0.05) -> Measurement:
    """Three rounds ``spread`` either side of ``rate``."""
    return Measurement.of([rate * (1 - spread), rate, rate * (1 + spread)])


def _modes(one_ips, ddp_ips, spread_one=0.05, spread_ddp=0.05):
    return pd.DataFrame([
        {"mode": "one device", "distributed": "none", "devices": 1, "global_batch": 64,
         "images_per_second": one_ips,
         "steps_per_rank": [12], "measured": _measured(one_ips, spread_one), "speedup": 1.0},
        {"mode": "DDP, 2 ranks", "distributed": "ddp", "devices": 2, "global_batch": 128,
         "images_per_second": ddp_ips,
         "steps_per_rank": [12, 12], "measured": _measured(ddp_ips, spread_ddp), "speedup": ddp_ips / one_ips}])


def test_an_impossible_ddp_speedup_is_reported_as_a_disturbed_measurement():
    """The runs seen on busy machines: 3.82x on 2 ranks, and 11x in a CPU-thread confound."""
    for ddp_rate in (382, 1100):
        text = ddp.ddp_answer(_modes(100, ddp_rate))
        assert "**disturbed measurement**" in text and "at most 2.00x" in text
        assert "DDP's own cost" not in text and "efficiency" not in text


def test_a_ddp_cost_inside_the_spread_is_no_measurable_difference():
    text = ddp.ddp_answer(_modes(100, 190))
    assert "DDP's own cost, one device's speed over one rank's: **1.05x**" in text
    assert "**no measurable difference**" in text and "disturbed" not in text


def test_a_ddp_cost_beyond_the_spread_is_reported_as_a_cost():
    text = ddp.ddp_answer(_modes(100, 150, spread_one=0.02, spread_ddp=0.03))
    assert "not hidden behind the backward pass" in text and "**no measurable difference**" not in text


def test_the_script_and_the_command_agree_within_the_spread_or_say_what_differs():
    same = ddp.speed_against_course([0.10, 0.11, 0.09, 0.10, 0.12, 0.10], [0.10, 0.105, 0.095, 0.11, 0.1, 0.1])
    assert "**no measurable difference**" in ddp.speed_against_course_answer(same)
    apart = ddp.speed_against_course([0.20, 0.21, 0.20, 0.20, 0.21], [0.10, 0.10, 0.101, 0.10, 0.10])
    text = ddp.speed_against_course_answer(apart)
    assert "**slower**" in text and "a difference that stays is real" in text
    too_few = ddp.speed_against_course([0.1, 0.1], [0.1, 0.12, 0.11])
    assert "cannot be judged" in ddp.speed_against_course_answer(too_few)


def _record(orders, samples=256):
    return {"world_size": 2, "samples": samples, "sampler": "DistributedSampler", "device": "cpu",
            "epochs": [{"epoch": e, "first_samples": o, "step_seconds": [0.1, 0.1]} for e, o in enumerate(orders)]}


def test_the_set_epoch_judgement_compares_every_epoch_with_the_samplers_own_order():
    """The launches themselves are in test_launched_checks; here the judgement of records such a launch writes."""
    epoch0, epoch1 = ddp.sampler_order(256, 2, 0, 6), ddp.sampler_order(256, 2, 1, 6)
    assert ddp.judge_set_epoch_removed(_record([epoch0] * 3)).done
    assert not ddp.judge_set_epoch_removed(_record([epoch0, epoch1, ddp.sampler_order(256, 2, 2, 6)])).done
    assert "does not shuffle" in ddp.judge_set_epoch_removed(_record([[0, 2, 4, 6, 8, 10]] * 3)).text
    assert "not with the order seed 0" in ddp.judge_set_epoch_removed(_record([epoch1] * 3)).text
    assert "not those `set_epoch(epoch)` gives" in ddp.judge_set_epoch_removed(_record([epoch0, epoch0, epoch1])).text
    assert "too few to compare" in ddp.judge_set_epoch_removed(_record([epoch0])).text
    outside = [order for order in ([1, 3, 5, 7, 9, 11], [0, 2, 4, 6, 8, 10]) if not set(order) <= set(
        ddp.sampler_order(256, 2, 0, 128))][0]  # not all in rank 0's share at epoch 0: drawn from the whole set
    assert "draws from another sampler" in ddp.judge_set_epoch_removed(_record([outside, epoch0, epoch0])).text
    random = {**_record([None] * 3), "sampler": "RandomSampler"}  # the loader shuffled the whole set itself
    assert "draws from another sampler (a RandomSampler" in ddp.judge_set_epoch_removed(random).text
    apart = {**_record([epoch0] * 3), "weights_sums": [1.5, 1.25]}
    assert "each trained a model of its own" in ddp.judge_set_epoch_removed(apart).text
    assert ddp.judge_set_epoch_removed({**_record([epoch0] * 3), "weights_sums": [1.5, 1.5]}).done


def test_a_missing_record_names_the_cell_that_writes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the cell that launches the script"):
        read_record(tmp_path / "record.json")


def _fsdp_record(groups, parameters=1.0):
    return {"world_size": 2, "model_mib": 4.0, "blocks_mib": [1.0, 1.0, 1.0], "groups_mib": groups,  # 1.0 left
            "ranks": [{"parameters_mib": parameters, "gradients_mib": parameters, "optimizer_state_mib": 2 * parameters}
                      for _ in range(2)]}


def test_the_fsdp_judgement_compares_the_groups_with_the_asked_layout():
    """The launches themselves are in test_launched_checks; here the judgement of records such a launch writes."""
    assert memory_ladder.judge_fewer_groups(_fsdp_record([1.0, 3.0])).done
    assert "still a group of its own" in memory_ladder.judge_fewer_groups(_fsdp_record([1.0] * 4)).text
    assert "one group holds" in memory_ladder.judge_fewer_groups(_fsdp_record([4.0])).text
    assert "asks for two" in memory_ladder.judge_fewer_groups(_fsdp_record([1.0, 1.0, 2.0])).text
    assert "in no group" in memory_ladder.judge_fewer_groups(_fsdp_record([1.0, 3.0], parameters=3.5)).text


def test_gpu_reference_rows_are_shown_only_where_a_gpu_recorded_them(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "results_dir", lambda: tmp_path)
    cpu = {"benchmark": "parallel_modes", "device": "CPU", "date": "2026-11-23", "versions": {}, "rows": [{"a": 1}]}
    (tmp_path / "cpu.json").write_text(json.dumps(cpu))
    said = reference.recorded_on_gpus("parallel_modes", "python benchmarks/parallel_modes.py")
    assert isinstance(said, str) and "No GPU numbers" in said and "benchmarks/parallel_modes.py" in said
    (tmp_path / "gpu.json").write_text(json.dumps({**cpu, "device": "NVIDIA H100 80GB HBM3"}))
    rows = reference.recorded_on_gpus("parallel_modes", "python benchmarks/parallel_modes.py")
    assert list(rows["device"]) == ["NVIDIA H100 80GB HBM3"]


@pytest.mark.parametrize("notebook", ["06_dataparallel", "07_ddp", "08_multinode_scaling", "09_sharding_and_memory",
                                      "11_tensor_and_pipeline_parallel"])
def test_every_parallel_notebook_has_a_code_exercise_whose_collapsed_solution_nbval_runs(notebook):
    """nbval runs the notebooks as committed, so a solution cell that runs there cannot rot unnoticed."""
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    tags = [cell["metadata"].get("tags", []) for cell in cells]
    exercises = [i for i, t in enumerate(tags) if "exercise" in t]
    solutions = [i for i, t in enumerate(tags) if "solution" in t]
    assert exercises and solutions and min(exercises) < min(solutions)
    for index in solutions:
        cell = cells[index]
        assert cell["cell_type"] == "code" and cell["metadata"]["jupyter"]["source_hidden"]
        assert not {"nbval-skip", "skip-execution"} & set(tags[index])
        assert "check" in "".join(cell["source"]) or "print(" in "".join(cell["source"])


def test_launch_runs_a_script_file_under_torchrun(tmp_path):
    """Notebooks 07 and 09 launch the script a cell wrote: a path, not a module; its flags reach it."""
    script = tmp_path / "hello.py"
    script.write_text("import os, sys\n"
                      "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], sys.argv[1:])\n")
    result = launch(2, str(script), "--out", "x", log_dir=tmp_path / "logs", timeout_seconds=240, echo=False)
    assert result.ok
    said = "\n".join(result.lines)
    assert "rank 0 of 2 ['--out', 'x']" in said and "rank 1 of 2 ['--out', 'x']" in said


def test_the_dataparallel_exercise_check_wants_the_wrapped_models_own_weights_under_plain_names(tmp_path):
    import torch
    from torch import nn

    from course_utils.lessons import dataparallel
    from course_utils.training.models import build

    wrapped, path = nn.DataParallel(build("small_cnn")), tmp_path / "weights.pt"

    def check(saved, model="small_cnn"):
        torch.save(saved, path)
        verdict = dataparallel.check_plain_load(path, model, wrapped)
        assert str(verdict).startswith("Done: " if verdict.done else "Not yet: ")
        return verdict

    assert check(wrapped.module.state_dict()).done  # the solution
    assert check({name.removeprefix("module."): value for name, value in wrapped.state_dict().items()}).done
    assert "begin with 'module.'" in check(wrapped.state_dict()).text  # the cell as it is
    assert "not the weights of the model you wrapped" in check(build("small_cnn").state_dict()).text
    assert "more than tensors" in check(wrapped.module).text  # the whole model object
    assert "refuses these weights" in check(wrapped.module.state_dict(), "small_cnn_gn").text


def test_the_bus_bandwidth_check_names_what_a_wrong_factor_did():
    from course_utils.lessons import scaling

    measured = pd.DataFrame({"bytes": [1e6, 1e8], "seconds": [1e-3, 5e-2], "world_size": 2})
    measured["algorithm_gb_per_s"] = measured["bytes"] / measured["seconds"] / 1e9

    def check(factor):
        verdict = scaling.check_bus_bandwidth(lambda size, seconds, ranks: size / seconds / 1e9 * factor(ranks),
                                              measured)
        assert str(verdict).startswith("Done: " if verdict.done else "Not yet: ")
        return verdict

    assert check(lambda n: 2 * (n - 1) / n).done
    assert "the algorithm bandwidth, bytes over time, unchanged" in check(lambda n: 1.0).text
    assert "(n-1)/n" in check(lambda n: (n - 1) / n).text
    assert "GiB" in check(lambda n: 2 * (n - 1) / n * 1e9 / 2**30).text
    assert not check(lambda n: 2.0).done


def test_the_capstone_answer_compares_means_and_calls_an_impossible_efficiency_disturbed():
    from course_utils.doctor import transport
    from course_utils.lessons import detection

    scaled = pd.DataFrame([
        {"ranks": 1, "global_batch": 8, "mean_iteration_seconds": 1.0, "speedup": 1.0, "efficiency": 1.0,
         "box_ap": 0.1, "measured": _measured(8.0, 0.02)},
        {"ranks": 2, "global_batch": 8, "mean_iteration_seconds": 0.4, "speedup": 2.5, "efficiency": 1.25,
         "box_ap": 0.2, "measured": _measured(20.0, 0.02)}])
    steps = pd.DataFrame([{"communication_percent": 10.0, "step_ms": 100.0, "hidden_ms": 2.0,
                           "communication_ms": 10.0}])
    amp = pd.DataFrame([{"amp": "off", "seconds_per_iteration": 1.0, "speedup": 1.0, "box_ap": 0.1, "device": "CPU",
                         "measured": _measured(8.0)},
                        {"amp": "bf16", "seconds_per_iteration": 1.2, "speedup": 0.83, "box_ap": 0.1,
                         "device": "CPU", "measured": _measured(6.6)}])
    text = detection.answer(scaled, steps, transport.read([]), amp, "CPU processes", False)
    assert "disturbed measurement" in text and "0.400 s/it" in text
    assert "not the interconnect alone" in text and "frozen BatchNorm" in text
    assert "the interconnect is the difference" not in text
    assert "% efficiency" not in text and "efficiency **" not in text
    honest = scaled.assign(efficiency=[1.0, 0.9], speedup=[1.0, 1.8], measured=[_measured(8.0), _measured(14.4)])
    assert "disturbed" not in detection.answer(honest, steps, transport.read([]), amp, "CPU processes", False)


def test_the_team_s_seconds_per_iteration_are_their_training_time_over_90000_iterations():
    from course_utils.lessons import detection

    for row in detection.TEAM.itertuples():
        hours, minutes, seconds = map(int, row.wall_time.split(":"))
        assert (hours * 3600 + minutes * 60 + seconds) / 90_000 == pytest.approx(row.seconds_per_iteration, abs=2e-4)


@pytest.mark.parametrize(("given", "expected"), [({"SLURM_JOB_ACCOUNT": "project_465000001"}, "project_465000001"),
                                                 ({"SLURM_JOB_ACCOUNT": "project_465000001",
                                                   "SBATCH_ACCOUNT": "project_1"}, "project_1"),
                                                 ({}, "unset")])
def test_the_lumi_jupyter_init_bills_notebook_jobs_to_the_session_s_project(tmp_path, given, expected):
    """sbatch from notebook 08 reads SBATCH_ACCOUNT; in LUMI's Jupyter app Slurm names the project."""
    import os
    import subprocess

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "activate").write_text("")
    init = NOTEBOOKS.parent / "jobs" / "lumi" / "jupyter_init.sh"
    env = {key: value for key, value in os.environ.items() if key not in ("SLURM_JOB_ACCOUNT", "SBATCH_ACCOUNT")}
    said = subprocess.run(["bash", "-c", f"source {init} >/dev/null; echo ${{SBATCH_ACCOUNT-unset}}"],
                          env={**env, "COURSE_VENV": str(tmp_path), "TMPDIR": str(tmp_path), "HOME": str(tmp_path),
                               **given},
                          capture_output=True, text=True, check=True).stdout.split()[-1]
    assert said == expected


def test_dataparallel_on_one_gpu_reads_the_wrapper_s_cost_against_the_spread():
    from course_utils.lessons import dataparallel

    def modes(dp_rate, spread):
        return pd.DataFrame([{"mode": "one device", "distributed": "none", "images_per_second": 100.0,
                              "speedup": 1.0,
                              "measured": _measured(100.0, spread)},
                             {"mode": "DataParallel, 1 device(s)", "distributed": "dp",
                              "images_per_second": dp_rate, "devices": 1,
                              "speedup": dp_rate / 100, "measured": _measured(dp_rate, spread)}])
    assert "**no measurable difference**" in dataparallel.dataparallel_answer(modes(97.0, 0.03), 1)
    assert "**slower**" in dataparallel.dataparallel_answer(modes(70.0, 0.03), 1)
    two = modes(260.0, 0.03).assign(devices=[1, 2], peak_memory_per_device_mib=[None, [900.0, 500.0]])
    assert "**disturbed measurement**" in dataparallel.dataparallel_answer(two, 2)
    fine = modes(170.0, 0.03).assign(devices=[1, 2], peak_memory_per_device_mib=[None, [900.0, 500.0]])
    assert "**faster**" in dataparallel.dataparallel_answer(fine, 2)


def test_a_ddp_knob_cannot_gain_more_than_the_exposed_communication_allows():
    """The known bad case: "1 MB buckets: 1.69x the defaults, faster by more than the spread" beside an
    all-reduce measured at 5 % of the step, which caps any DDP setting at about 1.05x."""
    knobs = pd.DataFrame([{"setting": "defaults", "images_per_second": 100.0, "measured": _measured(100.0, 0.02)},
                          {"setting": "1 MB buckets", "images_per_second": 101.0, "measured": _measured(101.0, 0.02)},
                          {"setting": "another", "images_per_second": 169.0, "measured": _measured(169.0, 0.02)}])
    communication = pd.DataFrame([{"exposed_percent": 5.0}, {"exposed_percent": 4.0}])
    lines = ddp.knobs_answer(knobs, communication).splitlines()
    assert "at most **1.05x** faster" in lines[0] or "more than **1.05x** faster" in lines[0]
    assert "**no measurable difference**" in lines[1]
    assert "**disturbed measurement**" in lines[2] and "at most 1.05x" in lines[2]


def test_a_scaling_study_above_the_ideal_is_a_disturbed_measurement():
    from course_utils.lessons import scaling

    def table(rate_two):
        return pd.DataFrame([{"ranks": 1, "ideal": 1, "speedup": 1.0, "efficiency": 1.0, "global_batch": 64,
                              "measured": _measured(100.0, 0.03)},
                             {"ranks": 2, "ideal": 2, "speedup": rate_two / 100, "efficiency": rate_two / 200,
                              "global_batch": 128, "measured": _measured(rate_two, 0.03)}])
    above = scaling.scaling_answer({"weak": table(260.0)})
    assert "**disturbed measurement**" in above and "% efficiency" not in above
    fine = scaling.scaling_answer({"weak": table(180.0)})
    assert "disturbed" not in fine and "90% efficiency" in fine


def test_the_ladder_answer_calls_a_faster_recomputation_disturbed_and_claims_no_gpu_rows():
    def rung(name, state, activations, rate):
        return {"rung": name, "ranks": 2, "parameters_mib": state, "gradients_mib": state, "optimizer_state_mib": state,
                "activations_mib": activations, "images_per_second": rate, "measured": _measured(rate, 0.01),
                "skipped": None}
    ladder = pd.DataFrame([rung("DDP", 4.0, 10.0, 100.0), rung("FSDP", 2.0, 10.0, 95.0),
                           rung("FSDP + activation checkpointing", 2.0, 3.0, 97.0)])
    text = memory_ladder.memory_ladder_answer(ladder, "CPU processes")
    assert "**disturbed measurement**" in text and "not a finding" in text and "adds work" in text
    assert "recorded GPU rows below show" not in text


def test_rows_measured_on_cpu_ranks_say_so_wherever_they_ran():
    from course_utils.experiments.machine_shape import parallel_shape

    assert parallel_shape(gpus=1).rows_label() == ("CPU processes (gloo) on a node with one GPU: CPU figures, not GPU "
                                                   "figures")
    assert "a machine without GPUs" in parallel_shape(gpus=0).rows_label()
    assert parallel_shape(gpus=4).rows_label() == "4 GPUs, one rank each"


def test_each_speed_ratio_is_the_ratio_of_the_figures_printed_beside_it():
    """The seen case: "427 images/s against one device's 229 ... 1.95x" (the figures were the runs' overall
    rates, the ratio the median steps'). Here the overall rates differ from the medians on purpose."""
    modes = _modes(100, 190).assign(images_per_second=[111.0, 170.0])
    line = ddp.ddp_answer(modes).splitlines()[0]
    patterns = (r"\*\*(\d+)\*\* images/s", r"one device's (\d+)")
    figures = [float(re.search(pattern, line).group(1)) for pattern in patterns]
    ratio = float(re.search(r"\*\*(\d+\.\d+)x\*\*", line).group(1))
    assert figures == [190.0, 100.0] and round(figures[0] / figures[1], 2) == ratio, line
    knobs = pd.DataFrame([{"setting": "defaults", "images_per_second": 90.0, "measured": _measured(100.0, 0.02)},
                          {"setting": "1 MB buckets", "images_per_second": 120.0, "measured": _measured(101.0, 0.02)}])
    said = ddp.knobs_answer(knobs, pd.DataFrame([{"exposed_percent": 5.0}])).splitlines()[1]
    assert "101 images/s (the median step's) against the defaults' 100: **1.01x**" in said, said


def test_ddp_equals_the_large_batch_within_a_hundredth_of_the_controls_difference():
    """The seen case: GroupNorm, 2 ranks x 16 against batch 32, 3.16e-05 apart after 8 steps, called "different"
    by a fixed rtol of 1e-5, while halving the batch (the control) moved the weights by 5.7e-02. BatchNorm: the
    ranks' own statistics make a real difference, 6.6e-02 against the control's 3.7e-01 (runs of notebook 07)."""
    def apart(value: float) -> dict[str, float]:
        return {"max_abs_difference": value, "relative_to_largest_weight": value}

    table = pd.DataFrame(ddp.equivalence_rows("small_cnn_gn", 2, 16, apart(3.16e-5), apart(5.7e-2))
                         + ddp.equivalence_rows("small_cnn", 2, 16, apart(6.6e-2), apart(3.7e-1)))
    lines = ddp.equivalence_answer(table).splitlines()
    assert "5.5e-04 of the control's difference: **the same training**" in lines[0], lines[0]
    assert "the yardstick for the row above" in lines[1] and "(the control)" in lines[1], lines[1]
    assert "1.8e-01 of the control's difference: **different**" in lines[2], lines[2]
