"""Notebook 12: data-parallel ranks that time each step's parts (waiting for data, computing, the gradients'
all-reduce), one rank's loader slowed on purpose, each rank's times written for the straggler lesson.

    torchrun --nproc-per-node 2 -m course_utils.doctor.timed_ranks --slow-rank 1 --delay-ms 80 --out DIR

With ``--slow-from N`` the slowed loader sleeps from its Nth batch on: one launch holds the ranks alike, then one
slowed (each launch pays the start of every rank's process, longer than the steps themselves here).

Each rank trains a small convolutional network on its own random images, as DDP does but with the all-reduce
written out, so that its time is measured alone: a rank that reaches the all-reduce first waits there for the
last one, and that wait is what a straggler costs the others. Every rank writes ``DIR/rank-N.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course_utils import devices
from course_utils.atomic_files import write_text_atomic
from course_utils.parallel import process_group

# Per rank and step, with the model below: a few milliseconds of compute on one CPU core. A longer step would be
# stretched whenever another program shares the rank's core, and on a busy machine one of two alike ranks would
# then be "the straggler", by the CPU it was given rather than by anything it did.
IMAGES = 16
RECORD = "rank-{rank}.json"
# Each step's parts, as each rank records them: waiting for data, computing, the all-reduce.
PARTS = ("data_seconds", "compute_seconds", "collective_seconds")


def _model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 100))


class SlowCollate:
    """The loader's collate function, which sleeps ``delay`` seconds per batch from its batch ``start`` on: a slow
    disk or a busy decoder (batches come in order: the loader has no worker processes)."""

    def __init__(self, delay: float, start: int = 0) -> None:
        self.delay, self.start, self.batches = delay, start, 0

    def __call__(self, samples: list) -> list[torch.Tensor]:
        if self.batches >= self.start:
            time.sleep(self.delay)
        self.batches += 1
        return [torch.stack(column) for column in zip(*samples)]


def train(steps: int, delay: float, device: torch.device, slow_from: int = 0) -> list[dict[str, float]]:
    """``steps`` steps of this rank, its loader slowed by ``delay`` from step ``slow_from`` on; each step's seconds
    waiting for data, computing, and in the all-reduce."""
    torch.manual_seed(0)  # every rank starts from the same weights, as DDP's broadcast makes them
    model = _model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    data = TensorDataset(torch.randn(steps * IMAGES, 3, 32, 32, generator=generator),
                         torch.randint(0, 100, (steps * IMAGES,), generator=generator))
    loader = DataLoader(data, batch_size=IMAGES, collate_fn=SlowCollate(delay, slow_from))
    world, records = dist.get_world_size(), []
    batches = iter(loader)
    for step in range(steps):
        start = time.perf_counter()
        images, labels = (tensor.to(device) for tensor in next(batches))
        loaded = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(images), labels).backward()
        gradients = torch.cat([p.grad.flatten() for p in model.parameters()])
        devices.synchronize(device)
        computed = time.perf_counter()
        dist.all_reduce(gradients)  # every rank waits here until the last one brings its gradients
        devices.synchronize(device)
        reduced = time.perf_counter()
        offset = 0
        for p in model.parameters():
            p.grad.copy_(gradients[offset:offset + p.numel()].view_as(p) / world)
            offset += p.numel()
        optimizer.step()
        records.append({"step": step, **dict(zip(PARTS, (loaded - start, computed - loaded, reduced - computed)))})
        print(f"rank {rank} step {step}", flush=True)  # in its log: how far it got, read from outside
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--slow-rank", type=int, default=None, help="the rank whose loader sleeps (none: all alike)")
    parser.add_argument("--delay-ms", type=float, default=80.0, help="the slowed loader's sleep per batch")
    parser.add_argument("--slow-from", type=int, default=0, help="the step from which the slowed loader sleeps")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.delay_ms < 0 or args.steps < 1 or args.slow_from < 0:
        parser.error("--delay-ms is a sleep (0 or more), --steps a count (1 or more), --slow-from a step (0 or more)")
    where = process_group.join(timeout_seconds=120)
    device = devices.default_device() if devices.distributed_backend() == "nccl" else torch.device("cpu")
    try:
        delay = args.delay_ms / 1000 if where.rank == args.slow_rank else 0.0
        records = train(args.steps, delay, device, args.slow_from)
        args.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out / RECORD.format(rank=where.rank),
                          json.dumps({"rank": where.rank, "slowed": delay > 0, "delay_seconds": delay,
                                      "slow_from": args.slow_from, "device": str(device),
                                      "steps": records}))
    finally:
        process_group.leave()


if __name__ == "__main__":
    main()
