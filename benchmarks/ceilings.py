"""Record the card's ceilings: what one large matrix product and one convolution layer (forward and backward)
reach in bf16, fp16, TF32 and strict fp32, against the datasheet's dense peak (notebooks 02 and 05 read their
runs' MFU against the same peaks).

    python benchmarks/ceilings.py [--side 8192] [--repeats 50]

Goal: a bf16 matrix product reaches at least 60 % of the dense peak; the best achievable measured on an H100
SXM is about 80 % (795 of 989 TFLOP/s, Stas Bekman's Machine Learning Engineering book, its table of maximum
achievable matmul FLOPS). A lower share says the card or its stack is not what its name promises (a power or
clock cap, a slower variant, a library without its fast kernels), before any training is timed.
"""

from __future__ import annotations

import argparse

from course_utils import devices
from course_utils.experiments import reference
from course_utils.experiments.reference import Goal
from course_utils.observe import flops

MATMUL_SHARE_GOAL = 0.60
MATMUL_SOURCE = ("best achievable bf16 matmul on an H100 SXM about 795 of 989 dense TFLOP/s, 80 % (Machine Learning "
                 "Engineering, maximum achievable matmul FLOPS table)")
AMP_OF = {"bf16": "bf16", "fp16": "fp16", "tf32": "off", "fp32 strict": "off"}


CPU_LAYER = (8, 32, 14)  # a CPU (the dry run) times a small layer: the GPU's would take minutes in fp16


def ceiling_row(kind: str, precision: str, device, side: int, repeats: int) -> dict:
    """One kind of work (matmul or conv) in one precision: TFLOP/s, the dense peak and the share reached."""
    name = devices.device_name(device)
    row = {"kind": kind, "precision": precision, "status": "ok"}
    if precision == "tf32" and not devices.has_tf32(device):
        return {**row, "status": f"no TF32 on {name}: its fp32 is strict fp32"}
    if kind == "matmul":
        row.update(side=side, tflops=flops.matmul_tflops(precision, side, device, repeats))
    else:
        layer = flops.CONV_LAYER if device.type == "cuda" else CPU_LAYER
        row.update(layer=list(layer), tflops=flops.conv_tflops(precision, device, layer, repeats))
    peak = flops.peak_tflops(name, AMP_OF[precision], strict_fp32=precision == "fp32 strict")
    row["peak_tflops"] = peak[0] if peak else None
    row["share_of_peak"] = row["tflops"] / peak[0] if peak else None
    return row


def goals(rows: list[dict]) -> list[Goal]:
    """The bf16 matrix product's share of the dense peak against :data:`MATMUL_SHARE_GOAL`."""
    bf16 = next((row for row in rows if row["kind"] == "matmul" and row["precision"] == "bf16"), None)
    share = bf16.get("share_of_peak") if bf16 else None
    return [Goal("bf16 matmul, share of the dense peak", share, f"at least {MATMUL_SHARE_GOAL:.2f}",
                 None if share is None else share >= MATMUL_SHARE_GOAL, MATMUL_SOURCE)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", type=int, default=None, help="matrix side (default 8192 on a GPU, 256 on a CPU)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls of each (default 50 on a GPU, 3 on "
                                                                   "a CPU)")
    args = parser.parse_args()
    device = devices.default_device()
    on_gpu = device.type == "cuda"
    side, repeats = args.side or (8192 if on_gpu else 256), args.repeats or (50 if on_gpu else 3)
    stack = devices.detect()
    print(f"{devices.device_name(device)}: {stack.runtime or 'no GPU runtime'}, "
          f"{stack.dnn_library or 'no cuDNN/MIOpen'}, {stack.collective_library or 'no NCCL/RCCL'}, "
          f"PyTorch {stack.torch_version}")
    rows, path = [], None
    for kind in ("matmul", "conv"):
        for precision in flops.CEILING_PRECISIONS:
            rows.append(ceiling_row(kind, precision, device, side, repeats))
            path = reference.record("ceilings", rows, devices.device_name(device), reference.SYNTHETIC,
                                    goals(rows), path)
            row = rows[-1]
            shown = (f"{row['tflops']:.3g} TFLOP/s" + (f", {row['share_of_peak']:.0%} of {row['peak_tflops']:.0f}"
                                                       if row.get("peak_tflops") else "")
                     if row["status"] == "ok" else row["status"])
            print(f"{kind:>6} {precision:>11}: {shown}", flush=True)
    for goal in goals(rows):
        print(goal.line())
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
