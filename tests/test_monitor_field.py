"""The vendors' tools as users really ran them: nvidia-smi and rocm-smi outputs captured from the field (sources
in tests/fixtures/README.md), other releases and other GPUs than the hand-written fixtures beside them."""

from pathlib import Path

import pytest

from course_utils.observe.monitor.readings import parse_nvidia_smi, parse_rocm_smi

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
