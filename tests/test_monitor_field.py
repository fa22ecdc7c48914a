"""The vendors' tools as users really ran them: nvidia-smi, rocm-smi and amd-smi outputs captured from the field
(sources in tests/fixtures/README.md), other releases and other GPUs than the hand-written fixtures beside them."""

import json
import os
from pathlib import Path

import pytest

from course_utils.observe.monitor import open_backend
from course_utils.observe.monitor.readings import parse_amd_smi, parse_nvidia_smi, parse_rocm_smi

FIELD = Path(__file__).parent / "fixtures" / "monitor" / "field"


def _one(parse, name: str):
    (reading,) = parse((FIELD / name).read_text())
    return reading


def test_nvidia_smi_580_on_a_gb10_reports_no_memory_and_no_power_limit():
    gpu = _one(parse_nvidia_smi, "nvidia-smi_580_gb10.csv")
    assert (gpu.index, gpu.name, gpu.utilization_percent, gpu.power_watts) == (0, "NVIDIA GB10", 0.0, 5.04)
    assert gpu.memory_used_mib is None and gpu.memory_total_mib is None and gpu.power_limit_watts is None
    assert gpu.temperature_c == 39.0


def test_nvidia_smi_on_windows_with_units_in_every_value():
    gpu = _one(parse_nvidia_smi, "nvidia-smi_rtx_pro_6000_windows.csv")
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.power_watts, gpu.power_limit_watts) == \
        (2082.0, 97887.0, 26.47, 600.0)


def test_nvidia_smi_heads_the_sm_clock_by_its_full_name():
    """Asked for ``clocks.sm``, nvidia-smi heads the column ``clocks.current.sm [MHz]``."""
    gpu = _one(parse_nvidia_smi, "nvidia-smi_clocks_sm_header.csv")
    assert (gpu.clock_mhz, gpu.power_watts, gpu.power_limit_watts, gpu.utilization_percent) == \
        (2040.0, 34.19, 72.0, 0.0)


@pytest.mark.parametrize(("name", "power", "temperature", "used", "total"), [
    ("rocm-smi_7900xtx.json", 19.0, 49.0, 794341376 / 2**20, 25753026560 / 2**20),
    ("rocm-smi_6.2.4_radeon_780m_cut.json", 7.222, 31.0, None, None),
    ("rocm-smi_2019.json", 222.0, 103.0, None, None),  # old lower-case "(c)" labels
])
def test_rocm_smi_outputs_of_several_releases(name, power, temperature, used, total):
    card = _one(parse_rocm_smi, name)
    assert (card.power_watts, card.temperature_c) == (power, temperature)
    assert card.memory_used_mib == (pytest.approx(used) if used else None)
    assert card.memory_total_mib == (pytest.approx(total) if total else None)


def test_the_radeon_780m_names_itself_and_its_bus():
    card = _one(parse_rocm_smi, "rocm-smi_6.2.4_radeon_780m_cut.json")
    assert (card.name, card.utilization_percent, card.clock_mhz, card.pci_address) == \
        ("Phoenix3", 19.0, 800.0, "0000:c4:00")


def test_amd_smi_metric_of_a_radeon_reads_its_activity():
    card = _one(parse_amd_smi, "amd-smi_metric_usage_w7700_cut.json")
    assert (card.index, card.utilization_percent, card.power_watts, card.memory_used_mib) == (0, 42.0, None, None)


def test_amd_smi_metric_where_the_gpu_reports_nothing():
    """An APU whose every section is "N/A", the usage section itself included."""
    card = _one(parse_amd_smi, "amd-smi_metric_apu_all_na_cut.json")
    assert (card.utilization_percent, card.power_watts, card.clock_mhz, card.temperature_c) == (None,) * 4


def _amd_smi_with_every_section() -> list[dict]:
    """The Radeon's real output with the sections the CLI builds for --power --mem-usage --temperature --clock
    added, in its shape (ROCm/amdsmi, amdsmi_cli/amdsmi_commands.py at 0ceca28: {"value", "unit"}, memory
    // 2**20 labelled MB), with figures of the kind an MI250X's first GCD shows."""
    gpus = json.loads((FIELD / "amd-smi_metric_usage_w7700_cut.json").read_text())
    gpus[0].update({"power": {"socket_power": {"value": 287, "unit": "W"}, "gfx_voltage": "N/A"},
                    "mem_usage": {"total_vram": {"value": 65520, "unit": "MB"},
                                  "used_vram": {"value": 30210, "unit": "MB"}},
                    "temperature": {"edge": {"value": 41, "unit": "C"}, "hotspot": {"value": 52, "unit": "C"},
                                    "mem": "N/A"},
                    "clock": {"gfx_0": {"clk": {"value": 1700, "unit": "MHz"}, "min_clk": "N/A"}}})
    return gpus


@pytest.mark.parametrize("wrap", [lambda gpus: gpus, lambda gpus: {"gpu_data": gpus}],
                         ids=["rocm6-list", "rocm7-gpu_data"])
def test_amd_smi_metric_sections_in_both_layouts(wrap):
    """ROCm 7 wraps the list in {"gpu_data": [...]} (ROCm/amdsmi issue 134, amd-smi of ROCm 7.0.2)."""
    card, = parse_amd_smi(json.dumps(wrap(_amd_smi_with_every_section())))
    assert (card.utilization_percent, card.power_watts, card.memory_used_mib, card.memory_total_mib,
            card.temperature_c, card.clock_mhz) == (42.0, 287.0, 30210.0, 65520.0, 52.0, 1700.0)


def test_the_monitor_reads_amd_smi_where_it_is_the_tool_installed(tmp_path, monkeypatch):
    """ROCm releases that dropped rocm-smi: the monitor's amd-smi backend runs the command and reads it."""
    output = tmp_path / "metric.json"
    output.write_text(json.dumps(_amd_smi_with_every_section()))
    stand_in = tmp_path / "amd-smi"
    stand_in.write_text(f"#!/bin/sh\n[ \"$*\" = 'metric --usage --power --mem-usage --temperature --clock "
                        f"--json' ] || exit 2\ncat '{output}'\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    backend = open_backend("amd-smi")
    assert [(r.utilization_percent, r.power_watts) for r in backend.read()] == [(42.0, 287.0)]
