"""How much arithmetic a model asks per image, and how close a run comes to the hardware (notebooks 01, 02
and 05, the sweep and every run's summary).

FLOPs are counted by PyTorch's own ``torch.utils.flop_counter.FlopCounterMode`` over one training
step (forward and backward) of the model's architecture, so they follow the image size and the
layers exactly (a ResNet-50 at 224 px: 24.3 GFLOP per image, three times its 8.2 forward). Model
FLOP utilization (MFU) is the achieved rate, images per second times FLOPs per image, over the
device's peak for the precision the run computes in; the peaks are the vendors' published dense
(no sparsity) figures in :data:`PEAKS`, with their sources. Where the device is not in the table
(a CPU, another GPU) there is no MFU, rather than a guess.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from course_utils import devices
from course_utils.observe.clocks import timed_rate


@dataclass(frozen=True)
class Peak:
    """Dense peak TFLOP/s of one device: fp32 (without tensor cores), tf32 and 16-bit (fp16 and bf16)."""

    fp32: float
    tf32: float | None
    half: float
    source: str


# Matched by substring of torch.cuda.get_device_name(); one GCD of an MI250X is one device to PyTorch.
# The first key found in the name wins: the more specific ones come first.
PEAKS: dict[str, Peak] = {
    "H200": Peak(67.0, 494.7, 989.4, "NVIDIA H200 datasheet (SXM; half the listed sparse TF32/FP16 rates)"),
    "H100 PCIe": Peak(51.2, 378.0, 756.0, "NVIDIA H100 datasheet (PCIe; half the listed sparse TF32/FP16 rates)"),
    "H100": Peak(67.0, 494.7, 989.4, "NVIDIA H100 datasheet (SXM; half the listed sparse TF32/FP16 rates)"),
    "A100": Peak(19.5, 156.0, 312.0, "NVIDIA A100 datasheet (SXM and PCIe, dense)"),
    "MI300X": Peak(163.4, 653.7, 1307.4, "AMD Instinct MI300X datasheet (dense matrix)"),
    "MI250X": Peak(47.85, None, 191.5, "AMD Instinct MI250X datasheet, per GCD (half of the module's 95.7 "
                                       "FP32 matrix and 383 FP16/BF16 TFLOP/s)"),
}


def training_flops_per_image(build: Callable[[], nn.Module], image_size: int) -> float:
    """FLOPs of one training step (forward and backward) per image of the model ``build`` makes.

    The model is built on PyTorch's ``meta`` device: shapes without data, so counting costs no
    memory and no arithmetic and leaves the run's own model untouched.
    """
    batch = 2
    with torch.device("meta"):
        model = build().train()
        images = torch.randn(batch, 3, image_size, image_size)
    with FlopCounterMode(display=False) as counter:
        model(images).sum().backward()
    return counter.get_total_flops() / batch


def peak_tflops(device_name: str, amp: str, strict_fp32: bool = False) -> tuple[float, str] | None:
    """The device's dense peak for the precision a run computes in (``amp``: off, fp16, bf16), and its
    source; fp32 on an NVIDIA GPU since Ampere runs convolutions in TF32 by default, unless ``strict_fp32``
    keeps them off the tensor cores. None if unknown."""
    peak = next((value for key, value in PEAKS.items() if key in device_name), None)
    if peak is None:
        return None
    if amp in ("fp16", "bf16"):
        return peak.half, peak.source
    return (peak.fp32 if strict_fp32 else peak.tf32 or peak.fp32), peak.source


def mfu(images_per_second: float, flops_per_image: float, device_name: str, amp: str,
        devices: int = 1, strict_fp32: bool = False) -> float | None:
    """Achieved FLOP/s over ``devices`` devices' peak, as a fraction; None where the peak is not known."""
    peak = peak_tflops(device_name, amp, strict_fp32)
    if peak is None or not flops_per_image:
        return None
    return images_per_second * flops_per_image / (peak[0] * 1e12 * devices)


# The card's ceilings: what one large matrix product and one convolution layer reach in each precision.
CEILING_PRECISIONS = ("bf16", "fp16", "tf32", "fp32 strict")
CONV_LAYER = (128, 256, 14)  # batch, channels, side: a 3x3 layer of ResNet-50's third stage at 224 px


def _timed_tflops(work: Callable[[], object], flop: float, device: torch.device, repeats: int) -> float:
    """TFLOP/s of ``work`` (``flop`` each call) over ``repeats`` calls after two untimed ones, timed on the
    device's clock."""
    rate, _ = timed_rate(lambda: (work(), 1)[1], repeats, 2, device)
    return rate * flop / 1e12


def _precision_context(precision: str) -> contextlib.AbstractContextManager:
    """The fp32 settings a precision needs: strict fp32 for "fp32 strict", TF32 for "tf32"."""
    if precision in FP32_MODES:
        return devices.fp32_precision(FP32_MODES[precision])
    return contextlib.nullcontext()


FP32_MODES = {"tf32": "tf32", "fp32 strict": "ieee"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32 strict": torch.float32}


def matmul_tflops(precision: str, side: int, device: torch.device, repeats: int = 20) -> float:
    """TFLOP/s of ``side`` x ``side`` matrix products in ``precision`` (one of :data:`CEILING_PRECISIONS`)."""
    dtype = DTYPES[precision]
    a, b = (torch.randn(side, side, device=device, dtype=dtype) for _ in range(2))
    with _precision_context(precision):
        return _timed_tflops(lambda: a @ b, 2 * side ** 3, device, repeats)


def conv_tflops(precision: str, device: torch.device, layer: tuple[int, int, int] = CONV_LAYER,
                repeats: int = 20) -> float:
    """TFLOP/s of one 3x3 convolution layer's forward and backward pass (``layer``: batch, channels, side) in
    ``precision``; the 16-bit ones in channels_last, as tensor cores want them."""
    batch, channels, side = layer
    dtype = DTYPES[precision]
    memory = torch.channels_last if dtype != torch.float32 else torch.contiguous_format
    conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False).to(device, dtype, memory_format=memory)
    images = torch.randn(batch, channels, side, side, device=device, dtype=dtype).contiguous(memory_format=memory)
    images.requires_grad_(True)

    def step() -> None:
        conv(images).sum().backward()

    forward = 2 * batch * channels * channels * 9 * side * side
    with _precision_context(precision):
        return _timed_tflops(step, 3 * forward, device, repeats)  # forward, input gradient, weight gradient
