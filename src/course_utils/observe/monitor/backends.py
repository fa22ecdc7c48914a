"""Where readings come from: NVML, AMD SMI, the vendors' command-line tools, or the CPU (notebook 02,
and any run with ``--monitor``).

``auto`` takes the first that works here, in the order of :data:`AUTO_ORDER`: the libraries are
cheaper than starting a tool every sample, and the CPU fallback always works, so that notebooks
run the same on a laptop and in CI. Asking for a backend that is not here is an error that
names what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable

import psutil

from course_utils import config
from course_utils.observe.monitor.readings import (
    Reading,
    amd_smi_command,
    nvidia_smi_command,
    parse_amd_smi,
    parse_nvidia_smi,
    parse_rocm_smi,
    pci_address,
    rocm_smi_command,
)

MIB = 2**20
# AMD SMI marks a field it cannot read with its type's largest value (UINT32_MAX, UINT64_MAX for the 64-bit
# ones); its Python layer writes some as "N/A", which is no number either
UNSUPPORTED = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)
MICROWATTS_ABOVE = 10_000  # no GPU draws 10 kW: a larger power figure is in microwatts
# amdsmi_get_power_info's power fields, newest first, as each release documents them: socket_power (ROCm 7.0
# on, W; in 6.4 only on a VM host, in uW), current_socket_power (6.0 on, MI300 and later), average_socket_power
# (5.7 on, MI200 and earlier: LUMI's MI250X). A release fills those its GPU supports.
AMD_POWER_FIELDS = ("socket_power", "current_socket_power", "average_socket_power")


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here; the message names what is missing."""


class Backend:
    name = "base"

    def read(self) -> list[Reading]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds (library handles)."""


class NvmlBackend(Backend):
    name = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as error:
            raise BackendUnavailable("nvml needs the nvidia-ml-py package: pip install nvidia-ml-py") from error
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise BackendUnavailable(f"nvml: the NVIDIA driver library is not usable here ({error})") from error
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not self.handles:
            raise BackendUnavailable("nvml: the driver reports no NVIDIA GPU")

    def _value(self, call: Callable, *args, scale: float = 1.0) -> float | None:
        try:
            return call(*args) / scale
        except self.nvml.NVMLError:
            return None

    def read(self) -> list[Reading]:
        nvml, readings = self.nvml, []
        for index, handle in enumerate(self.handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = self._value(lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu, handle)
            readings.append(Reading(
                index=index,
                name=str(nvml.nvmlDeviceGetName(handle)),
                utilization_percent=utilization,
                memory_used_mib=memory.used / MIB,
                memory_total_mib=memory.total / MIB,
                power_watts=self._value(nvml.nvmlDeviceGetPowerUsage, handle, scale=1000),  # mW
                power_limit_watts=self._value(nvml.nvmlDeviceGetEnforcedPowerLimit, handle, scale=1000),
                temperature_c=self._value(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
                clock_mhz=self._value(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                pci_address=pci_address(_text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
            ))
        return readings

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    """NVML returns bytes in older releases of its bindings, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else value


def _amd_number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value not in UNSUPPORTED else None


def _amd_watts(value) -> float | None:
    number = _amd_number(value)
    return number / 1e6 if number is not None and number > MICROWATTS_ABOVE else number


def amd_power(power: dict) -> tuple[float | None, float | None]:
    """The power drawn and the power limit, in watts, from ``amdsmi_get_power_info``'s dict, read from whichever
    of :data:`AMD_POWER_FIELDS` this release and GPU fill (the limit is in microwatts in some releases)."""
    drawn = next((watts for field in AMD_POWER_FIELDS if (watts := _amd_watts(power.get(field))) is not None), None)
    return drawn, _amd_watts(power.get("power_limit"))


class AmdSmiBackend(Backend):
    name = "amdsmi"

    def __init__(self) -> None:
        try:
            import amdsmi
        except ImportError as error:
            raise BackendUnavailable("amdsmi needs ROCm's amdsmi Python package (shipped with ROCm 6 and later, "
                                     "e.g. /opt/rocm/share/amd_smi); pip install it from there") from error
        try:
            amdsmi.amdsmi_init()
            self.handles = amdsmi.amdsmi_get_processor_handles()
        except amdsmi.AmdSmiException as error:
            raise BackendUnavailable(f"amdsmi: the AMD GPU driver is not usable here ({error})") from error
        if not self.handles:
            raise BackendUnavailable("amdsmi: no AMD GPU found")
        self.amdsmi = amdsmi

    def _call(self, function: Callable, *args) -> dict:
        try:
            return function(*args)
        except self.amdsmi.AmdSmiException:
            return {}

    def _bdf(self, handle) -> str:
        try:
            return self.amdsmi.amdsmi_get_gpu_device_bdf(handle)
        except self.amdsmi.AmdSmiException:
            return ""

    def read(self) -> list[Reading]:
        smi, readings = self.amdsmi, []
        for index, handle in enumerate(self.handles):
            activity = self._call(smi.amdsmi_get_gpu_activity, handle)
            vram = self._call(smi.amdsmi_get_gpu_vram_usage, handle)  # MB
            drawn, limit = amd_power(self._call(smi.amdsmi_get_power_info, handle))
            readings.append(Reading(
                index=index,
                name=self._call(smi.amdsmi_get_gpu_asic_info, handle).get("market_name", "AMD GPU"),
                utilization_percent=_amd_number(activity.get("gfx_activity")),
                memory_used_mib=_amd_number(vram.get("vram_used")),
                memory_total_mib=_amd_number(vram.get("vram_total")),
                power_watts=drawn,
                power_limit_watts=limit,
                clock_mhz=_amd_number(self._call(smi.amdsmi_get_clock_info, handle, smi.AmdSmiClkType.GFX).get("clk")),
                pci_address=pci_address(self._bdf(handle)),
            ))
        return readings

    def close(self) -> None:
        self.amdsmi.amdsmi_shut_down()


class CommandBackend(Backend):
    """A vendor tool run once per sample; its output goes through the matching parser.

    A tool that hangs (a driver in trouble), fails or prints what the parser cannot read raises
    :class:`BackendUnavailable`: at the start, ``auto`` then takes the next backend; later, the
    monitor stops sampling and the run goes on.
    """

    timeout_seconds = 5.0

    def __init__(self, name: str, command: list[str], parse: Callable[[str], list[Reading]]) -> None:
        if shutil.which(command[0]) is None:
            raise BackendUnavailable(f"{name}: the command {command[0]!r} is not on PATH")
        self.name, self.command, self.parse = name, command, parse
        self.read()  # fail now, with the tool's message, rather than in the sampling thread

    def read(self) -> list[Reading]:
        try:
            result = subprocess.run(self.command, capture_output=True, text=True, timeout=self.timeout_seconds)
        except subprocess.TimeoutExpired as error:
            raise BackendUnavailable(f"{self.name} did not answer within {self.timeout_seconds:.0f} s") from error
        if result.returncode != 0:
            raise BackendUnavailable(f"{self.name} failed ({result.returncode}): {result.stderr.strip()[:300]}")
        try:
            readings = self.parse(result.stdout)
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise BackendUnavailable(f"{self.name} printed output that is not its readings "
                                     f"({type(error).__name__}: {error}): {result.stdout.strip()[:120]!r}") from error
        if not readings:
            raise BackendUnavailable(f"{self.name} printed no device readings: {result.stdout.strip()[:120]!r}")
        return readings


class CpuBackend(Backend):
    """This process's CPU use (in % of the cores it may use), its resident memory, and the machine's memory.

    CPU use is measured between consecutive reads; the first read, with no interval behind it,
    reports none.
    """

    name = "cpu"

    def __init__(self) -> None:
        self.process = psutil.Process(os.getpid())
        self.cores = config.usable_cores()  # the cores this process may use, not all the node's
        self._last = (time.perf_counter(), self._cpu_seconds())

    def _cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system + times.children_user + times.children_system

    def read(self) -> list[Reading]:
        now, cpu = time.perf_counter(), self._cpu_seconds()
        elapsed = now - self._last[0]
        utilization = None
        if elapsed >= 0.01:
            utilization = min(100.0, 100 * (cpu - self._last[1]) / elapsed / self.cores)
            self._last = (now, cpu)
        return [Reading(
            index=0,
            name=f"CPU ({self.cores} cores, this process)",
            utilization_percent=utilization,
            memory_used_mib=self.process.memory_info().rss / MIB,
            memory_total_mib=psutil.virtual_memory().total / MIB,
        )]


FACTORIES: dict[str, Callable[[], Backend]] = {
    "nvml": NvmlBackend,
    "amdsmi": AmdSmiBackend,
    "nvidia-smi": lambda: CommandBackend("nvidia-smi", nvidia_smi_command(), parse_nvidia_smi),
    "rocm-smi": lambda: CommandBackend("rocm-smi", rocm_smi_command(), parse_rocm_smi),
    "amd-smi": lambda: CommandBackend("amd-smi", amd_smi_command(), parse_amd_smi),
    "cpu": CpuBackend,
}
# amd-smi after rocm-smi: where both are installed rocm-smi also names each GPU's PCI bus (which GPU is this
# process's); amd-smi serves the ROCm releases without rocm-smi.
AUTO_ORDER = ("nvml", "amdsmi", "nvidia-smi", "rocm-smi", "amd-smi", "cpu")
BACKEND_NAMES = ("auto",) + AUTO_ORDER


def open_backend(name: str = "auto") -> Backend:
    """The backend called ``name``, or for ``auto`` the first of :data:`AUTO_ORDER` that works."""
    if name == "auto":
        for candidate in AUTO_ORDER:
            try:
                return FACTORIES[candidate]()
            except BackendUnavailable:
                continue
    if name not in FACTORIES:
        raise ValueError(f"unknown monitor backend {name!r}; choose one of: {', '.join(BACKEND_NAMES)}")
    return FACTORIES[name]()
