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

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


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


def peak_tflops(device_name: str, amp: str) -> tuple[float, str] | None:
    """The device's dense peak for the precision a run computes in (``amp``: off, fp16, bf16), and its
    source; fp32 on an NVIDIA GPU since Ampere runs convolutions in TF32 by default. None if unknown."""
    peak = next((value for key, value in PEAKS.items() if key in device_name), None)
    if peak is None:
        return None
    if amp in ("fp16", "bf16"):
        return peak.half, peak.source
    return (peak.tf32 or peak.fp32), peak.source


def mfu(images_per_second: float, flops_per_image: float, device_name: str, amp: str,
        devices: int = 1) -> float | None:
    """Achieved FLOP/s over ``devices`` devices' peak, as a fraction; None where the peak is not known."""
    peak = peak_tflops(device_name, amp)
    if peak is None or not flops_per_image:
        return None
    return images_per_second * flops_per_image / (peak[0] * 1e12 * devices)
