import json
import os
import random
import shutil
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from course_utils.experiments.monitor_cost import monitor_cost, monitor_cost_goals, monitor_cost_reading
from course_utils.lessons import monitoring
from course_utils.observe.monitor import (
    BackendUnavailable,
    Monitor,
    open_backend,
    parse_nvidia_smi,
    parse_rocm_smi,
    summarize,
    this_process_rows,
)
from course_utils.observe.monitor.__main__ import main
from course_utils.observe.monitor.backends import Backend
from course_utils.observe.monitor.views import live, timeline
from course_utils.observe.noise import SLOWER

FIXTURES = Path(__file__).parent / "fixtures" / "monitor"


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_nvidia_smi_without_units():
    first, second = parse_nvidia_smi(_fixture("nvidia-smi_a100_nounits.csv"))
    assert (first.index, first.name) == (0, "NVIDIA A100-SXM4-40GB")
    assert (first.utilization_percent, first.memory_used_mib, first.memory_total_mib) == (98, 31245, 40960)
    assert (first.power_watts, first.power_limit_watts, first.temperature_c, first.clock_mhz) == (287.41, 400, 61, 1410)
    assert second.index == 1 and second.utilization_percent == 0


def test_nvidia_smi_with_units_in_values():
    (reading,) = parse_nvidia_smi(_fixture("nvidia-smi_units.csv"))
    assert (reading.utilization_percent, reading.memory_used_mib, reading.power_watts) == (100, 70211, 689.95)


def test_nvidia_smi_not_available_values_become_none():
    mig, geforce = parse_nvidia_smi(_fixture("nvidia-smi_not_supported.csv"))
    assert mig.utilization_percent is None and mig.memory_used_mib == 13
    assert geforce.power_limit_watts is None and geforce.power_watts == 9.02


def test_rocm_5_mi250x_module_power_sits_on_the_primary_gcd():
    primary, secondary = parse_rocm_smi(_fixture("rocm-smi_5_mi250x.json"))
    assert primary.name.startswith("AMD INSTINCT MI250X")
    assert (primary.utilization_percent, primary.power_watts, primary.power_limit_watts) == (93, 462, 560)
    assert primary.memory_total_mib == pytest.approx(65520) and primary.clock_mhz == 1700
    assert primary.temperature_c == 59  # junction, the hottest and the one that throttles
    assert "GCD 1" in primary.power_note
    assert secondary.power_watts is None and secondary.power_limit_watts is None
    assert "secondary" in secondary.power_note and secondary.utilization_percent == 91


def test_rocm_6_0_spellings():
    primary, secondary = parse_rocm_smi(_fixture("rocm-smi_6.0_mi250.json"))
    assert primary.name == "AMD INSTINCT MI250 (MCM) OAM AC MBA"
    assert (primary.utilization_percent, primary.power_watts, primary.clock_mhz) == (50, 102, 800)
    assert primary.memory_used_mib == pytest.approx(51527024640 / 2**20)
    assert secondary.power_watts is None and secondary.memory_used_mib == pytest.approx(11.125)


def test_rocm_6_2_current_socket_power():
    (reading,) = parse_rocm_smi(_fixture("rocm-smi_6.2_mi300x.json"))
    assert (reading.power_watts, reading.power_limit_watts, reading.utilization_percent) == (612, 750, 100)
    assert reading.temperature_c == 52 and reading.power_note == ""


def test_rocm_without_power_keys():
    (reading,) = parse_rocm_smi(_fixture("rocm-smi_6.x_radeon.json"))
    assert reading.name == "Radeon RX 7900 XT" and reading.power_watts is None
    assert reading.memory_total_mib == pytest.approx(21458059264 / 2**20)


def _on_path(command: str) -> bool:
    return shutil.which(command) is not None


def test_unknown_backend_lists_the_choices():
    with pytest.raises(ValueError, match="nvml, amdsmi"):
        open_backend("tpu")


@pytest.mark.skipif(_on_path("rocm-smi"), reason="rocm-smi is installed here")
def test_absent_tool_is_named():
    with pytest.raises(BackendUnavailable, match="'rocm-smi' is not on PATH"):
        open_backend("rocm-smi")


def test_sampler_yields_samples_with_phases_and_stops_cleanly():
    threads_before = set(threading.enumerate())
    with Monitor(backend="cpu", interval=0.05) as monitor:
        monitor.phase("warm-up")
        time.sleep(0.3)
        monitor.phase("epoch 1")
        sum(i * i for i in range(2_000_000))
    frame = monitor.frame()
    assert set(threading.enumerate()) == threads_before
    assert len(frame) >= 5 and frame["seconds"].is_monotonic_increasing
    assert {"warm-up", "epoch 1"} <= set(frame["phase"])
    table = summarize(frame)
    assert {"warm-up", "epoch 1"} <= set(table["phase"]) and (table["samples"] > 0).all()


def test_timeline_plot_and_no_live_view_without_a_person():
    with Monitor(backend="cpu", interval=0.05) as monitor:
        monitor.phase("a")
        time.sleep(0.2)
        assert live(monitor) is None
    figure = timeline(monitor.frame())
    assert len(figure.axes) == 3


def test_command_line_once_as_json(capsys):
    code = main(["--backend", "cpu", "--once", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    sample = json.loads(out.strip())
    assert sample["backend"] == "cpu" and sample["memory_total_mib"] > 0


@pytest.mark.skipif(_on_path("nvidia-smi"), reason="nvidia-smi is installed here")
def test_command_line_refuses_an_absent_backend(capsys):
    assert main(["--backend", "nvidia-smi", "--once"]) == 1
    assert "nvidia-smi" in capsys.readouterr().err


def test_bus_ids_of_every_tool_are_spelled_one_way():
    from course_utils.observe.monitor.readings import pci_address

    assert pci_address("00000000:C9:00.0") == pci_address("0000:C9:00.0") == pci_address("0000:c9:00.0") == "0000:c9:00"
    assert pci_address("[N/A]") == pci_address(None) == ""


def test_nvidia_smi_bus_ids_are_read():
    readings = parse_nvidia_smi(_fixture("nvidia-smi_h100_bus_ids.csv"))
    assert [r.pci_address for r in readings] == ["0000:18:00", "0000:2a:00", "0000:3a:00"]


@pytest.mark.parametrize(("tool", "fixture", "mine", "busy_index"), [
    ("rocm-smi", "rocm-smi_5_mi250x_shared_node.json", "0000:c9:00", 2),
    ("nvidia-smi", "nvidia-smi_h100_bus_ids.csv", "0000:2a:00", 1),
])
def test_on_a_shared_node_the_monitor_reads_this_process_gpu_not_the_lowest_index(tool, fixture, mine, busy_index,
                                                                                   tmp_path, monkeypatch):
    """The tool lists every GPU of the node; this process trains on one of them (its PCI address, as the
    runtime reports it), which need not be index 0: a neighbour's idle GCD must not stand in for it."""
    stand_in = tmp_path / tool
    stand_in.write_text(f"#!/bin/sh\ncat '{FIXTURES / fixture}'\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monitor = Monitor(tool)
    monitor.pci_address = mine  # what torch.cuda.get_device_properties says on that node
    monitor.sample()
    rows = this_process_rows(monitor.frame())
    assert rows["index"].tolist() == [busy_index] and rows["utilization_percent"].iloc[0] >= 97
    monitor.pci_address = ""  # a CPU run, or a tool that prints no address: the lowest index, as before
    second = pd.DataFrame(monitor.sample())
    assert this_process_rows(second)["index"].tolist() == [0]


def test_the_power_answer_on_a_secondary_gcd_says_where_its_power_went():
    """On an MI250X the second GCD of a module reads no power: the answer names that, not a missing GPU."""
    reading = next(r for r in parse_rocm_smi(_fixture("rocm-smi_5_mi250x.json")) if r.index == 1)
    rows = pd.DataFrame([{"status": "ok", "model": "resnet18", "batch_size": 256, "utilization_percent": 91.0,
                          "power_watts": reading.power_watts, "power_limit_watts": reading.power_limit_watts,
                          "power_note": reading.power_note}])
    text = monitoring.utilization_vs_power_answer(rows)
    assert "second GCD of its MI250X module" in text and "about **300 W**" in text and "**560 W**" in text
    assert "machine without a GPU" in monitoring.utilization_vs_power_answer(rows.assign(power_note=""))



def _samples(utilization_by_phase: list[tuple[str, float]], per_phase: int = 4) -> pd.DataFrame:
    rows, seconds = [], 0.0
    for phase, utilization in utilization_by_phase:
        for _ in range(per_phase):
            rows.append({"seconds": seconds, "phase": phase, "index": 0, "name": "GPU", "this_process": True,
                         "utilization_percent": utilization, "memory_used_mib": 1000 + seconds,
                         "memory_total_mib": 80000, "power_watts": None, "power_limit_watts": None})
            seconds += 0.5
    return pd.DataFrame(rows)


def test_the_timeline_is_read_from_the_samples_not_asserted():
    dropped = monitoring.timeline_reading(_samples([("epoch 1", 95), ("eval 1", 40), ("epoch 2", 96), ("eval 2", 42)]))
    assert "**96 %** while training and **41 %** in evaluation: evaluation is smaller work" in dropped
    level = monitoring.timeline_reading(_samples([("epoch 1", 90), ("eval 1", 92)]))
    assert "kept the device about as busy" in level
    assert "Too few samples" in monitoring.timeline_reading(_samples([("epoch 1", 90)]))


def test_phase_labels_of_short_phases_do_not_print_over_each_other():
    phases = [(f"{kind} {n}", 50.0) for n in range(1, 21) for kind in ("epoch", "eval")]
    figure = timeline(_samples(phases, per_phase=1), title="many short phases")
    labels = [text.get_text() for text in figure.axes[0].texts]
    assert 0 < len(labels) < len(phases) and labels[0] == "epoch 1"


def test_energy_per_image_is_the_reported_power_over_the_training_time_and_images(quick, tmp_path, monkeypatch):
    """A stand-in nvidia-smi prints the A100 record (287.41 W on GPU 0) every sample: the summary's joules
    per image must be that power times the iterations' measured seconds, over the images trained."""
    from course_utils.observe.metrics import load_run
    from course_utils.train import train

    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncat '{FIXTURES / 'nvidia-smi_a100_nounits.csv'}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    summary = train(**{**quick, "max_steps": 6, "input_delay_ms": 60}, monitor="nvidia-smi", monitor_interval=0.05)
    seconds = load_run(quick["out"]).iterations["seconds"].sum()
    assert summary["joules_per_image"] == pytest.approx(287.41 * seconds / (6 * quick["batch_size"]), rel=1e-6)


def test_auto_samples_the_cpu_for_a_run_on_the_cpu_even_beside_a_gpu_tool(tmp_path, monkeypatch):
    """CPU ranks on a GPU machine (notebooks 07 and 08 with one GPU) would otherwise report an idle GPU."""
    import torch

    from course_utils.observe.monitor.backends import open_backend
    from course_utils.observe.monitor.sampler import Monitor

    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncat '{FIXTURES / 'nvidia-smi_a100_nounits.csv'}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert open_backend("auto").name == "nvidia-smi"  # what auto finds on this machine
    assert Monitor("auto", device=torch.device("cpu")).backend_name == "cpu"
    assert Monitor("nvidia-smi", device=torch.device("cpu")).backend_name == "nvidia-smi"  # asked by name


def _device(index, address, utilization):
    return {"index": index, "pci_address": address, "utilization_percent": utilization}


def test_each_nodes_utilization_is_that_of_the_devices_this_run_used_there():
    """Node 0 runs two ranks beside a neighbour's idle GPU; node 1 one rank beside a busy neighbour: each
    node's figure is the mean over this run's devices, matched by PCI address; a CPU (no address) is read."""
    from course_utils.training.summary import node_utilization

    ranks = [{"node_rank": 0, "node": "a", "pci_addresses": ["0000:c1:00"]},
             {"node_rank": 0, "node": "a", "pci_addresses": ["0000:c6:00"]},
             {"node_rank": 1, "node": "b", "pci_addresses": ["0000:d1:00"]}]
    watched = [{"backend": "nvml", "devices": [_device(0, "0000:c1:00", 80.0), _device(1, "0000:c6:00", 60.0),
                                               _device(2, "0000:c9:00", 0.0)]},
               None,
               {"backend": "nvml", "devices": [_device(0, "0000:d0:00", 99.0), _device(1, "0000:d1:00", 90.0)]}]
    first, second = node_utilization(ranks, watched)
    assert (first["node"], first["devices"], first["utilization_percent"]) == ("a", [0, 1], 70.0)
    assert (second["node_rank"], second["devices"], second["utilization_percent"]) == (1, [1], 90.0)
    on_a_cpu = node_utilization([{"node_rank": 0, "node": "a", "pci_addresses": [""]}],
                                [{"backend": "cpu", "devices": [_device(0, "", float("nan"))]}])
    assert on_a_cpu[0]["devices"] == [0] and on_a_cpu[0]["utilization_percent"] is None


class _GreedyBackend(Backend):
    """A monitor that takes the interpreter: each reading sorts a shuffled list in C, which holds the GIL for its
    whole length (a spin in Python would hand the GIL back every 5 ms), so the training step waits for it however
    busy the machine is."""

    name = "greedy"
    unsorted = random.Random(0).sample(range(100_000), 100_000)

    def read(self) -> list:
        sorted(self.unsorted)
        return []


def test_the_monitor_cost_study_sees_a_monitor_that_takes_the_processor():
    """Plain / monitored / plain blocks: a monitor that holds the interpreter between its samples slows the monitored
    blocks by far more than the two plain blocks around them differ, and the study says so."""
    def greedy(device):
        monitor = Monitor("cpu", 0.001, device)
        monitor.backend = _GreedyBackend()
        return monitor

    table = monitor_cost("small_cnn", 16, steps=5, rounds=3, warmup=2, make_monitor=greedy, size="ci", device="cpu")
    cost, floor, comparison = monitor_cost_reading(table)
    assert list(table["backend"]) == ["greedy"] * 3 and cost.count == floor.count == 3
    assert comparison.verdict == SLOWER and cost.median > floor.median


def _blocks(plain: list[float], monitored: list[float]) -> pd.DataFrame:
    """Rounds of plain / monitored / plain blocks with these throughputs (the plain ones in pairs)."""
    rows = []
    for number, seen in enumerate(monitored):
        before, after = plain[2 * number], plain[2 * number + 1]
        rows.append({"round": number, "plain_before": before, "monitored": seen, "plain_after": after,
                     "cost": (before + after) / 2 / seen - 1, "noise_floor": abs(before / after - 1)})
    return pd.DataFrame(rows)


def test_the_monitors_cost_is_judged_through_the_spreads_against_its_goal():
    steady = [1000, 1001, 999, 1000, 1002, 998, 1000, 1001, 999, 1000]
    cheap, resolved = monitor_cost_goals(_blocks(steady, [996, 997, 995, 996, 997]))
    assert cheap.met and resolved.met and "1%" in cheap.goal and cheap.value == pytest.approx(0.004, abs=0.001)
    costly, _ = monitor_cost_goals(_blocks(steady, [950, 951, 949, 950, 952]))
    assert costly.met is False
    noisy = [1000, 1040, 960, 1030, 970, 1000, 1050, 950, 1000, 1020]
    unresolved, floor = monitor_cost_goals(_blocks(noisy, [996, 997, 995, 996, 997]))
    assert unresolved.met is None and floor.met is False and "not judged" in unresolved.line()
    faster, said = monitor_cost_goals(_blocks(steady, [1100, 1101, 1099, 1100, 1102]))  # watching cannot speed it up
    assert faster.met is None and "disturbed" in said.source


