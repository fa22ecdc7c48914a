"""One sample of one device, whatever tool it came from, and the parsers of the vendors' tools
(notebook 02, and any run with ``--monitor``).

Parsers read the tools' real output formats. ``nvidia-smi --query-gpu=... --format=csv,nounits``
prints a header with units in brackets and values such as ``[N/A]`` or ``[Not Supported]``; the header names
each field by its full name (``clocks.current.sm`` where ``clocks.sm`` was asked for), so the full names are asked.
``rocm-smi --json`` prints one object per ``cardN`` whose keys are the text labels of its plain
output, and those labels changed between ROCm releases: power is ``Average Graphics Package
Power (W)`` in ROCm 5 and on MI200, ``Current Socket Graphics Package Power (W)`` where the
socket reports it (ROCm 6 on MI300 and APUs). On an MI250X the two GCDs of one module share a
power sensor: the primary GCD reports the whole module, the secondary ``N/A (Secondary die)``.
``amd-smi metric --json``, rocm-smi's successor, prints one object per GPU (a list; from ROCm 7 inside
``{"gpu_data": [...]}``), each value ``{"value": 42, "unit": "%"}`` or ``"N/A"``, memory in MB of 2**20 bytes.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import asdict, dataclass

NVIDIA_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw",
                 "power.limit", "temperature.gpu", "clocks.current.sm", "pci.bus_id")
MIB = 2**20
SECONDARY_DIE = "Secondary die"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Reading:
    """One device at one moment. ``None`` where the tool does not report a quantity."""

    index: int
    name: str
    utilization_percent: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_c: float | None = None
    clock_mhz: float | None = None
    power_note: str = ""  # e.g. "module power, shared with GCD 1" on an MI250X
    pci_address: str = ""  # "0000:c1:00": how this device is matched to the one a process trains on

    def as_dict(self) -> dict:
        return asdict(self)


def number(text: str | float | int | None) -> float | None:
    """The number in a tool's value ("69.89 W", "(1700Mhz)", "42"), or None for N/A and the like."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    if "N/A" in text or "Not Supported" in text or "Unknown" in text:
        return None
    match = _NUMBER.search(text)
    return float(match.group()) if match else None


def pci_address(text: str | None) -> str:
    """``domain:bus:device`` in one spelling, from the tools' (``00000000:C1:00.0`` from nvidia-smi and NVML,
    ``0000:C1:00.0`` from rocm-smi, ``0000:c1:00.0`` from AMD SMI); empty when there is none."""
    match = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?\s*", text or "")
    if not match:
        return ""
    domain, bus, device = (int(part, 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def nvidia_smi_command() -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,nounits"]


def parse_nvidia_smi(text: str) -> list[Reading]:
    """Readings from ``nvidia-smi --query-gpu=... --format=csv[,nounits]`` (header required); without an
    ``index`` column the GPUs are numbered in the order nvidia-smi lists them, as it numbers them itself."""
    rows = [row for row in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if row]
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", column.strip()) for column in rows[0]]
    if not set(header) & set(NVIDIA_FIELDS):
        raise ValueError(f"no nvidia-smi CSV header (none of its fields) in {rows[0]!r}")
    readings = []
    for position, row in enumerate(rows[1:]):
        value = dict(zip(header, (cell.strip() for cell in row)))
        readings.append(Reading(
            index=int(value.get("index", position)),
            name=value.get("name", ""),
            utilization_percent=number(value.get("utilization.gpu")),
            memory_used_mib=number(value.get("memory.used")),
            memory_total_mib=number(value.get("memory.total")),
            power_watts=number(value.get("power.draw")),
            power_limit_watts=number(value.get("power.limit")),
            temperature_c=number(value.get("temperature.gpu")),
            clock_mhz=number(value.get("clocks.current.sm")),
            pci_address=pci_address(value.get("pci.bus_id")),
        ))
    return readings


def rocm_smi_command() -> list[str]:
    return ["rocm-smi", "--showuse", "--showmeminfo", "vram", "--showpower", "--showmaxpower", "--showtemp",
            "--showclocks", "--showproductname", "--showbus", "--json"]


def _first(card: dict, *keys: str) -> str | None:
    """The value of the first key present (the spelling changed between ROCm releases)."""
    lowered = {key.lower().rstrip(":"): value for key, value in card.items()}
    for key in keys:
        if key.lower() in lowered:
            return lowered[key.lower()]
    return None


def _bytes_to_mib(text: str | None) -> float | None:
    value = number(text)
    return None if value is None else value / MIB


def parse_rocm_smi(text: str) -> list[Reading]:
    """Readings from ``rocm-smi ... --json`` of ROCm 5 or 6; shared MI250X power is marked."""
    data = json.loads(text)
    readings = []
    for key in sorted((k for k in data if k.startswith("card")), key=lambda k: int(k[4:])):
        card = data[key]
        power_text = _first(card, "Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)")
        readings.append(Reading(
            index=int(key[4:]),
            name=_first(card, "Card Series", "Device Name", "Card model") or "",
            utilization_percent=number(_first(card, "GPU use (%)")),
            memory_used_mib=_bytes_to_mib(_first(card, "VRAM Total Used Memory (B)")),
            memory_total_mib=_bytes_to_mib(_first(card, "VRAM Total Memory (B)")),
            power_watts=number(power_text),
            power_limit_watts=number(_first(card, "Max Graphics Package Power (W)")),
            temperature_c=number(_first(card, "Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)")),
            clock_mhz=number(_first(card, "sclk clock speed")),
            power_note=SECONDARY_DIE if power_text and SECONDARY_DIE in power_text else "",
            pci_address=pci_address(_first(card, "PCI Bus")),
        ))
    return _mark_shared_power(readings)


def _mark_shared_power(readings: list[Reading]) -> list[Reading]:
    """Say which primary GCD's power reading also covers a secondary GCD next to it."""
    secondaries = {r.index for r in readings if r.power_note == SECONDARY_DIE}
    marked = []
    for reading in readings:
        partner = next((i for i in (reading.index + 1, reading.index - 1) if i in secondaries), None)
        values = reading.as_dict()
        if reading.index in secondaries:
            values.update(power_watts=None, power_limit_watts=None,
                          power_note="secondary GCD: its power is counted in its module's primary GCD")
        elif partner is not None:
            values.update(power_note=f"whole module: this GCD and GCD {partner}")
        marked.append(Reading(**values))
    return marked


def amd_smi_command() -> list[str]:
    return ["amd-smi", "metric", "--usage", "--power", "--mem-usage", "--temperature", "--clock", "--json"]


def _amd_value(section: object, *path: str) -> float | None:
    """The number at ``path`` inside an ``amd-smi --json`` section: ``{"value": 42, "unit": "%"}``, a bare number
    or ``"N/A"`` (a section is itself ``"N/A"`` when the GPU reports none of it)."""
    for key in path:
        section = section.get(key) if isinstance(section, dict) else None
    if isinstance(section, dict):
        section = section.get("value")
    return number(section) if isinstance(section, (int, float, str)) else None


def _first_number(*values: float | None) -> float | None:
    return next((value for value in values if value is not None), None)


def parse_amd_smi(text: str) -> list[Reading]:
    """Readings from ``amd-smi metric ... --json`` (ROCm 6: a list of GPUs; ROCm 7: ``{"gpu_data": [...]}``).
    ``socket_power`` is the module's on an MI250X, and ``"N/A"`` on its secondary GCD, as with rocm-smi."""
    data = json.loads(text)
    gpus = data.get("gpu_data", []) if isinstance(data, dict) else data
    return [Reading(
        index=int(gpu.get("gpu", position)),
        name="AMD GPU",
        utilization_percent=_amd_value(gpu.get("usage"), "gfx_activity"),
        memory_used_mib=_amd_value(gpu.get("mem_usage"), "used_vram"),
        memory_total_mib=_amd_value(gpu.get("mem_usage"), "total_vram"),
        power_watts=_amd_value(gpu.get("power"), "socket_power"),
        temperature_c=_first_number(_amd_value(gpu.get("temperature"), "hotspot"),
                                    _amd_value(gpu.get("temperature"), "edge")),
        clock_mhz=_amd_value(gpu.get("clock"), "gfx_0", "clk"),
    ) for position, gpu in enumerate(gpus)]
