"""No notebook: the verdict a check cell prints after a learner's change, the judging of a launched script's
record, and the small seeded model and batches the lessons' checks run the learner's code on.

Each notebook's exercise changes code in a cell; its check cell calls the lesson's check, which runs the
learner's code and returns whether the change did what the exercise asked, with what it showed. A check of a
script launched with torchrun (notebooks 07, 09 and 11) judges only what this launch wrote, and only when every
rank ended cleanly: a record an earlier attempt left is removed before the launch, and a failed launch is
reported as such, never judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from course_utils.parallel.launch import LaunchResult, remove_outputs


@dataclass(frozen=True)
class Check:
    """Whether an exercise is done, and what the check measured."""

    done: bool
    text: str

    def __str__(self) -> str:
        return ("Done: " if self.done else "Not yet: ") + self.text


def _ranks(ranks: list[int]) -> str:
    names = [str(rank) for rank in ranks]
    return "rank " + names[0] if len(names) == 1 else "ranks " + ", ".join(names[:-1]) + " and " + names[-1]


def judge_launch(record: Path, start: Callable[[], LaunchResult], judge: Callable[[Path], Check]) -> Check:
    """Remove ``record`` (a file, or the contents of a folder), run ``start`` (a torchrun launch of the learner's
    script that writes ``record``), and ``judge`` the record only if every rank ended cleanly and wrote it."""
    record = Path(record)
    remove_outputs([record])
    result = start()
    failed = sorted(result.failed_ranks)
    if failed:
        return Check(False, f"your script failed on {_ranks(failed)}: read its error above, correct the script, "
                            "write it again (run its cell) and run this cell again. Nothing was judged.")
    if not result.ok:
        return Check(False, f"torchrun failed before your script ran (exit code {result.returncode}): read its "
                            "error above. Nothing was judged.")
    if not record.exists() or (record.is_dir() and not any(record.iterdir())):
        return Check(False, f"your script ended cleanly but wrote nothing to {record}: keep the lines at its end "
                            "that write what the check reads.")
    return judge(record)


def tiny_cnn(classes: int = 100) -> nn.Module:
    """A convolution and a linear layer, seeded: small enough that a check trains it in a second on a CPU."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(256, classes))


def fixed_batches(count: int, size: int = 8, classes: int = 100) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` seeded batches of random 16x16 images and labels."""
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(size, 3, 16, 16, generator=generator), torch.randint(classes, (size,), generator=generator))
            for _ in range(count)]
