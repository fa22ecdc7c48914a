"""A DDP rank that dies: the others stop within bounded time and name it; torchrun's restart resumes."""

import threading
import time

import psutil
import torch

from course_utils import checkpoint
from course_utils.launch import launch
from course_utils.train import to_flags


def _options(tiny_root, out, **extra):
    return to_flags(size="ci", data_dir=tiny_root, model="small_cnn_gn", train_samples=256, test_samples=32, epochs=2,
                    batch_size=8, workers=0, log_every=2, checkpoint_every=4, device="cpu", progress=False,
                    distributed="ddp", out=out, **extra)


def _rank_process(rank: int, marker: str) -> psutil.Process | None:
    """The training process of ``rank`` among the launch whose arguments contain ``marker``."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(process.info["cmdline"] or []) and process.environ().get("RANK") == str(rank) \
                    and "course_utils.train" in " ".join(process.info["cmdline"]):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def _kill_rank_after(rank: int, folder, step: int, marker: str) -> threading.Thread:
    """Kill ``rank`` with SIGKILL once the run has a checkpoint at ``step`` or later (in a thread)."""
    def watch():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            steps = [int(p.stem.split("-")[1]) for p in folder.glob("step-*.pt")]
            if steps and max(steps) >= step and (process := _rank_process(rank, marker)) is not None:
                process.kill()
                return
            time.sleep(0.01)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_dead_rank_ends_the_job_quickly_and_is_named(tiny_root, tmp_path):
    out = tmp_path / "run"
    watcher = _kill_rank_after(1, out / "checkpoints", 4, str(out))
    start = time.monotonic()
    result = launch(2, "course_utils.train", *_options(tiny_root, out), log_dir=tmp_path / "logs", echo=False,
                    timeout_seconds=300)
    watcher.join()
    assert not result.ok
    assert time.monotonic() - start < 120  # rank 0 did not wait out the 600 s collective timeout
    text = "\n".join(result.lines)
    assert "rank      : 1" in text or "rank: 1" in text, text[-2000:]
    assert "Signal 9 (SIGKILL)" in text or "exitcode  : -9" in text


def test_torchrun_restarts_from_the_last_checkpoint(tiny_root, tmp_path):
    reference = launch(2, "course_utils.train", *_options(tiny_root, tmp_path / "reference"),
                       log_dir=tmp_path / "reference-logs", echo=False, timeout_seconds=300)
    assert reference.ok
    out = tmp_path / "run"
    watcher = _kill_rank_after(1, out / "checkpoints", 8, str(out))
    result = launch(2, "course_utils.train", *_options(tiny_root, out, resume="auto"), log_dir=tmp_path / "logs",
                    echo=False, timeout_seconds=300, max_restarts=1)
    watcher.join()
    assert result.ok, "\n".join(result.lines[-30:])
    assert any("resuming from" in line for line in result.lines)
    final = checkpoint.load(out / "checkpoints" / "last.pt")["model"]
    expected = checkpoint.load(tmp_path / "reference" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(final[name], expected[name]) for name in expected)  # every rank loaded rank 0's file
