"""All-reduce bandwidth, measured and reported as nccl-tests define it (notebook 08, and the
``allreduce.sbatch`` job scripts).

    torchrun --standalone --nproc-per-node 2 -m course_utils.doctor.allreduce --max-bytes 64M

For a message of S bytes that takes t seconds, the *algorithm bandwidth* is S / t. A ring
all-reduce moves 2(n-1)/n times S through each rank's link, so the *bus bandwidth*
S / t * 2(n-1)/n is comparable with the hardware's link speed whatever the rank count n. Small
messages measure latency, large ones bandwidth. Every message is checked: each rank contributes
rank + 1, so every element must come back as n(n+1)/2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from course_utils import config, devices
from course_utils.atomic_files import write_text_atomic
from course_utils.parallel import process_group

UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
MAX_BYTES = {"ci": 2**22, "workshop": 2**30}  # the largest message of a sweep, by course size


def bus_bandwidth(algorithm_bandwidth: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: what each link carried, per second."""
    return algorithm_bandwidth * 2 * (world_size - 1) / world_size


def parse_bytes(text: str) -> int:
    """``"64M"`` -> 67108864 (binary units, as nccl-tests' -b/-e)."""
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


def message_sizes(min_bytes: int, max_bytes: int, factor: int = 4) -> list[int]:
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def measure(nbytes: int, device: torch.device, iterations: int = 20, warmup: int = 5) -> dict:
    """One message size: seconds per all-reduce (the slowest rank's mean), bandwidths, and the check."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.empty(max(1, nbytes // 4), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    tensor.fill_(rank + 1)
    dist.all_reduce(tensor)
    wrong = int((tensor != world * (world + 1) / 2).sum().item())
    devices.synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    devices.synchronize(device)
    seconds = torch.tensor([(time.perf_counter() - start) / iterations], device=device, dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    size = tensor.numel() * tensor.element_size()
    algorithm = size / seconds.item()
    return {"bytes": size, "seconds": seconds.item(), "algorithm_gb_per_s": algorithm / 1e9,
            "bus_gb_per_s": bus_bandwidth(algorithm, world) / 1e9, "wrong": wrong, "world_size": world,
            "backend": dist.get_backend()}


def sweep(sizes: list[int], device: torch.device, iterations: int = 20) -> pd.DataFrame:
    return pd.DataFrame([measure(size, device, iterations) for size in sizes])


def format_table(table: pd.DataFrame) -> str:
    """The sweep in nccl-tests' columns."""
    lines = [f"{'size (B)':>12} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13} {'#wrong':>7}"]
    for row in table.itertuples():
        lines.append(f"{row.bytes:>12} {row.seconds * 1e6:>11.1f} {row.algorithm_gb_per_s:>13.3f} "
                     f"{row.bus_gb_per_s:>13.3f} {row.wrong:>7}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    size = config.get_size()
    parser = argparse.ArgumentParser(prog="python -m course_utils.doctor.allreduce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-bytes", default="1K", help="smallest message (default 1K)")
    parser.add_argument("--max-bytes", default=str(MAX_BYTES[size.name]),
                        help=f"largest message, e.g. 1G (default for the {size.name} size: {MAX_BYTES[size.name]})")
    parser.add_argument("--factor", type=int, default=4, help="each message this many times the last (default 4)")
    parser.add_argument("--iterations", type=int, default=20, help="timed all-reduces per size (default 20)")
    parser.add_argument("--out", help="write the table to this JSON file (rank 0)")
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto",
                        help="auto: each rank's GPU with NCCL/RCCL where there are GPUs; cpu: CPU tensors with gloo "
                             "(also on a GPU machine, e.g. with fewer GPUs than ranks)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    where = process_group.join(timeout_seconds=300, backend="gloo" if args.device == "cpu" else None)
    if not where.distributed:
        print("error: an all-reduce needs several processes; start this under torchrun or srun, e.g. "
              "torchrun --standalone --nproc-per-node 2 -m course_utils.doctor.allreduce", file=sys.stderr)
        return 2
    try:
        device = torch.device("cpu") if args.device == "cpu" else devices.default_device()
        table = sweep(message_sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.factor), device,
                      args.iterations)
        if where.is_main:
            print(f"all-reduce, {where.world_size} ranks, {dist.get_backend()}, float32")
            print(format_table(table))
            if args.out:
                write_text_atomic(Path(args.out), json.dumps(table.to_dict("records"), indent=1) + "\n")
    except BaseException:
        process_group.leave()
        raise
    process_group.leave(together=True)
    return 0 if (table["wrong"] == 0).all() else 1


if __name__ == "__main__":
    process_group.end_process(main())
