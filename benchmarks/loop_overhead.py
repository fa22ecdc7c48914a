"""What does the course's training loop cost over a bare hand-written PyTorch loop?

Both loops train the same model on the same synthetic images through the same DataLoader, with
the same batch size and the same number of warm-up iterations left out of the timing. The course
loop additionally times every iteration, accumulates the loss, writes metrics and TensorBoard
events and draws no progress bar. Runs alternate (course, bare, course, bare, ...) so that drifts
of the machine hit both alike; the medians are compared. Goal: the course loop costs <= 2 % more.

    python benchmarks/loop_overhead.py [--model resnet18] [--batch-size 128] [--steps 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn

from course_utils import devices
from course_utils.data.datasets import SyntheticImages
from course_utils.data.loaders import build_loader
from course_utils.experiments import reference
from course_utils.observe.clocks import warmup_steps
from course_utils.observe.noise import Measurement, compare
from course_utils.train import train
from course_utils.training import models
from course_utils.training.setup import seed_everything


def bare_loop(model_name: str, batch_size: int, steps: int, device: torch.device) -> float:
    """Images per second of the plainest loop that does the same work."""
    seed_everything(0)
    loader = build_loader(SyntheticImages(batch_size * steps), batch_size, shuffle=True, drop_last=True)
    model = models.build(model_name).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()
    skip = warmup_steps(steps, 1, steps)
    start = None
    for step, (images, labels) in enumerate(loader):
        if step == skip:
            devices.synchronize(device)
            start = time.perf_counter()
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    devices.synchronize(device)
    return (steps - skip) * batch_size / (time.perf_counter() - start)


def course_loop(model_name: str, batch_size: int, steps: int, device: torch.device) -> float:
    with tempfile.TemporaryDirectory() as out:
        summary = train(model=model_name, data="synthetic", batch_size=batch_size, max_steps=steps, epochs=1,
                        train_samples=batch_size * steps, test_samples=batch_size, workers=0, lr=0.01,
                        out=out, progress=False, device=str(device))
    return summary["images_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: resnet18 on a GPU, small_cnn on a CPU")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 128 on a GPU, 64 on a CPU")
    parser.add_argument("--steps", type=int, default=60, help="iterations per run; the first fifth is warm-up")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each loop, alternating")
    args = parser.parse_args()
    device = devices.default_device()
    on_gpu = device.type == "cuda"
    model_name = args.model or ("resnet18" if on_gpu else "small_cnn")
    batch_size = args.batch_size or (128 if on_gpu else 64)
    course, bare = [], []
    for repeat in range(args.repeats):
        course.append(course_loop(model_name, batch_size, args.steps, device))
        bare.append(bare_loop(model_name, batch_size, args.steps, device))
        print(f"repeat {repeat + 1}: course {course[-1]:.1f} images/s, bare {bare[-1]:.1f} images/s")
    cost = compare(Measurement.of(bare), Measurement.of(course))  # bare over course: above 1 where the loop costs
    course_median, bare_median = statistics.median(course), statistics.median(bare)
    overhead = 100 * (cost.ratio - 1)
    print(f"median: course {course_median:.1f}, bare {bare_median:.1f} images/s; the course loop costs "
          f"{overhead:+.2f} % (goal <= 2 %); bare over course: {cost.verdict}")
    path = reference.record("loop_overhead", [{
        "model": model_name, "batch_size": batch_size, "steps": args.steps, "repeats": args.repeats,
        "course_images_per_second": course_median, "bare_images_per_second": bare_median,
        "course_runs": course, "bare_runs": bare, "overhead_percent": overhead, "verdict": cost.verdict}],
        devices.device_name(device), reference.SYNTHETIC)
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
