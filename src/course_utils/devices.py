"""What accelerator is here (CUDA, ROCm/HIP or CPU) and what follows from it (notebooks 00 and 05-08,
and every run).

PyTorch's ROCm build answers to the ``torch.cuda`` API, so "CUDA available" is also true on an
AMD MI250X; ``torch.version.hip`` is what tells the two apart. Notebooks, the training loop and
the distributed set-up ask this module instead of repeating those checks.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from course_utils import config, versions


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_gib: float


@dataclass(frozen=True)
class Accelerator:
    """A snapshot of the accelerator stack this process sees."""

    kind: str  # "cuda", "rocm" or "cpu"
    gpus: tuple[GPU, ...] = field(default_factory=tuple)
    runtime: str = ""  # "CUDA 12.8" or "HIP 6.4..." ; empty on CPU
    dnn_library: str = ""  # "cuDNN 9.10.2" or "MIOpen 3.4.0"
    collective_library: str = ""  # "NCCL 2.27.3" or "RCCL 2.22.3"
    backend: str = "gloo"  # torch.distributed backend that fits: nccl (also RCCL) or gloo
    torch_version: str = torch.__version__
    cpu_count: int = 1

    @property
    def device_count(self) -> int:
        return len(self.gpus)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)


def decode_dnn_version(version: int, is_rocm: bool) -> str:
    """``torch.backends.cudnn.version()`` as text: on ROCm it is MIOpen's version number."""
    if is_rocm:  # MIOpen encodes MAJOR*1000000 + MINOR*1000 + PATCH
        return f"MIOpen {version // 1_000_000}.{version // 1000 % 1000}.{version % 1000}"
    if version >= 10_000:  # cuDNN 9 and later: MAJOR*10000 + MINOR*100 + PATCH
        return f"cuDNN {version // 10_000}.{version // 100 % 100}.{version % 100}"
    return f"cuDNN {version // 1000}.{version // 100 % 10}.{version % 100}"  # cuDNN 8: MAJOR*1000 + ...


def _dnn_library(is_rocm: bool) -> str:
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return decode_dnn_version(version, is_rocm) if version else ""


def _collective_library(is_rocm: bool) -> str:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return ""
    text = ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)
    return f"{'RCCL' if is_rocm else 'NCCL'} {text}"


def detect() -> Accelerator:
    """Look at the GPUs this process can see (honours CUDA/HIP/ROCR_VISIBLE_DEVICES)."""
    cpu_count = config.usable_cores()
    if not torch.cuda.is_available():
        return Accelerator(kind="cpu", cpu_count=cpu_count)
    is_rocm = torch.version.hip is not None
    gpus = tuple(
        GPU(index=i, name=torch.cuda.get_device_name(i),
            memory_gib=torch.cuda.get_device_properties(i).total_memory / 2**30)
        for i in range(torch.cuda.device_count())
    )
    return Accelerator(
        kind="rocm" if is_rocm else "cuda",
        gpus=gpus,
        runtime=f"HIP {torch.version.hip}" if is_rocm else f"CUDA {torch.version.cuda}",
        dnn_library=_dnn_library(is_rocm),
        collective_library=_collective_library(is_rocm),
        backend="nccl",
        cpu_count=cpu_count,
    )


# The kernel drivers' device files: on a node with AMD GPUs (ROCm's /dev/kfd) or NVIDIA GPUs, whatever
# PyTorch build is installed.
DRIVER_FILES = {"AMD": Path("/dev/kfd"), "NVIDIA": Path("/dev/nvidiactl")}


def gpu_vendors_on_node() -> tuple[str, ...]:
    """The GPU makers whose driver this node exposes ("AMD", "NVIDIA"), whether PyTorch can use them or not."""
    return tuple(vendor for vendor, path in DRIVER_FILES.items() if path.exists())


def gpu_mismatch(vendors: tuple[str, ...], hip: str | None, cuda: str | None, available: bool,
                 env: Mapping[str, str] = os.environ) -> str | None:
    """Why this node's GPUs are of no use to this PyTorch, and the fix; None when there is nothing to say
    (no GPU here, or PyTorch uses them). ``hip``/``cuda`` are ``torch.version.hip``/``.cuda``."""
    if available or not vendors:
        return None
    vendor = vendors[0]
    build = "ROCm" if hip else "CUDA" if cuda else "CPU-only"
    found = f"this node has {vendor} GPUs ({DRIVER_FILES[vendor]}), but this PyTorch ({torch.__version__}) is a"
    if vendor == "AMD" and not hip:
        return (f"{found} {build} build that cannot use them. Use PyTorch's ROCm build: on LUMI the course "
                "container (README, 'On LUMI'), elsewhere the ROCm wheels (README, 'Other machines').")
    if vendor == "NVIDIA" and not cuda:
        return (f"{found} {build} build that cannot use them. Install the CUDA build: make install (README, "
                "'Other machines').")
    named = [f"{name}={env[name]!r}" for name in config.VISIBLE_VARIABLES[vendor] if name in env]
    visible = ", ".join(named) or "none set"
    tool = "rocm-smi (or amd-smi, its successor)" if vendor == "AMD" else "nvidia-smi"
    return (f"{found} {build} build, and torch.cuda.is_available() is False: no GPU is given to this job "
            f"(visible-device variables: {visible}; on Slurm ask for --gpus-per-node), or the driver is older than "
            f"the build needs. Check with {tool}.")


def gpu_mismatch_here() -> str | None:
    """:func:`gpu_mismatch` for this process."""
    return gpu_mismatch(gpu_vendors_on_node(), torch.version.hip, torch.version.cuda, torch.cuda.is_available())


def default_device() -> torch.device:
    """The device this process trains on: its current GPU (the first, unless joining a process group
    made it this rank's own), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def has_tf32(device: torch.device) -> bool:
    """Whether fp32 work on ``device`` may run on TF32 tensor cores: NVIDIA GPUs since Ampere (compute
    capability 8.0). A CPU and an MI250X compute fp32 as fp32."""
    return (device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device) >= (8, 0))


def tf32_convolutions() -> bool:
    """Whether this process runs fp32 convolutions in TF32 where the device can (PyTorch's default)."""
    return torch.backends.cudnn.conv.fp32_precision != "ieee"


@dataclass(frozen=True)
class ConvAutotune:
    """Whether cuDNN or MIOpen times the convolution algorithms of each new input shape
    (``torch.backends.cudnn.benchmark``), and why; ``str()`` is what the run's summary records."""

    on: bool
    reason: str

    def __str__(self) -> str:
        return f"{'on' if self.on else 'off'} ({self.reason})"


def conv_autotune(device_type: str, hip: str | None, detection: bool) -> ConvAutotune:
    """The course's choice for a run on ``device_type``; ``hip`` is ``torch.version.hip`` (None: not ROCm).

    On ROCm, PyTorch turns benchmark mode into MIOpen's NORMAL find mode (aten/src/ATen/miopen/Descriptors.h),
    which times every solver and does not answer from the find database, so each new process searches again:
    about 15-16 s per convolution layer, 280-300 s for a typical CNN (ROCm/rocm-libraries#3553), and every
    torchrun rank of every lesson is a new process. Left off, PyTorch since 2.7 (pytorch/pytorch#145294) lets
    MIOpen take a find-database hit or else do a quick search and record it: one job searches, the next reads
    (jobs/lumi/lumi_env.sh keeps the database between jobs; jobs/lumi/SETTINGS.md has the sources)."""
    if device_type != "cuda":
        return ConvAutotune(False, "CPU: no cuDNN or MIOpen")
    if detection:
        return ConvAutotune(False, "detection: every new image size would be searched again")
    if hip:
        return ConvAutotune(False, "ROCm: benchmark mode repeats MIOpen's exhaustive search in every process, "
                                   "ROCm/rocm-libraries#3553; off, MIOpen answers from its find database")
    return ConvAutotune(True, "CUDA: cuDNN times each new input shape once, in the first steps")


@contextlib.contextmanager
def fp32_precision(mode: str) -> Iterator[None]:
    """fp32 convolutions and matrix products in ``mode`` inside the block: "ieee" (strict fp32, off the TF32
    tensor cores) or "tf32"; the process's own settings again after it (they are global to the process)."""
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    before = conv.fp32_precision, matmul.fp32_precision
    conv.fp32_precision = matmul.fp32_precision = mode
    try:
        yield
    finally:
        conv.fp32_precision, matmul.fp32_precision = before


def strict_fp32() -> contextlib.AbstractContextManager[None]:
    """Strict fp32 inside the block: what an MI250X or a CPU computes anyway (:func:`fp32_precision`)."""
    return fp32_precision("ieee")


def pci_address(device: torch.device) -> str:
    """``domain:bus:device`` of a GPU as the monitors' tools spell it (``0000:c1:00``), so that a monitor
    on a shared node reads this process's GPU and not a neighbour's; empty on the CPU."""
    if device.type != "cuda":
        return ""
    properties = torch.cuda.get_device_properties(device)
    parts = [getattr(properties, f"pci_{name}_id", None) for name in ("domain", "bus", "device")]
    return "" if None in parts else "{:04x}:{:02x}:{:02x}".format(*parts)


def device_name(device: torch.device) -> str:
    """What summaries, tables and plots call ``device``: the GPU's model name, or ``CPU``."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def peak_memory_mib(device: torch.device) -> float | None:
    """The most memory PyTorch's allocator held on a GPU since the last reset; None on the CPU."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def distributed_backend() -> str:
    """``nccl`` where there are GPUs (RCCL answers to that name on ROCm), ``gloo`` on CPU."""
    return detect().backend


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a host clock measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(accelerator: Accelerator | None = None) -> str:
    """A plain-text report of the hardware and software stack, for notebook 00 and job logs."""
    acc = accelerator or detect()
    lines = [
        f"python        {platform.python_version()} on {platform.machine()} ({acc.cpu_count} CPU cores usable)",
        f"torch         {acc.torch_version}: {versions.support_note(acc.torch_version)}",
    ]
    if not acc.has_gpu:
        mismatch = gpu_mismatch_here()
        lines += [
            "accelerator   none: training runs on the CPU" if mismatch is None else
            f"accelerator   none usable. WARNING: {mismatch}",
            f"backend       {acc.backend} (torch.distributed on CPU)",
        ]
        return "\n".join(lines)
    lines += [
        f"accelerator   {'AMD ROCm' if acc.kind == 'rocm' else 'NVIDIA CUDA'}, {acc.device_count} device(s)",
        f"runtime       {acc.runtime}",
        f"dnn library   {acc.dnn_library or 'not found'}",
        f"collectives   {acc.collective_library or 'not found'}",
        f"backend       {acc.backend}",
    ]
    lines += [f"gpu {gpu.index:<9} {gpu.name}, {gpu.memory_gib:.1f} GiB" for gpu in acc.gpus]
    if acc.kind == "rocm":
        lines.append("note          each MI250X module shows up as two GCDs, i.e. two devices here")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())  # python -m course_utils.devices: the report notebook 00 prints, for a terminal or a job log
    sys.exit(1 if gpu_mismatch_here() else 0)
