"""Nothing lost: runs killed at arbitrary moments, or asked to stop by a signal, resume bit for bit."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from course_utils import checkpoint, preemption
from course_utils.loop import NonFiniteLossError
from course_utils.preemption import StopSignals
from course_utils.train import train

# Augmentation and a worker process make the replay non-trivial: the resumed run must draw the same
# random crops and flips as the uninterrupted one.
FLAGS = ["--size", "ci", "--model", "small_cnn", "--train-samples", "96", "--test-samples", "32", "--epochs", "2",
         "--batch-size", "16", "--workers", "1", "--log-every", "2", "--checkpoint-every", "2", "--no-progress",
         "--device", "cpu"]


def _start(tiny_root, out):
    return subprocess.Popen([sys.executable, "-m", "course_utils.train", *FLAGS, "--data-dir", str(tiny_root),
                             "--out", str(out), "--resume", "auto"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _newest_step(folder) -> int:
    steps = [int(m.group(1)) for p in folder.glob("step-*.pt") if (m := re.match(r"step-(\d+)\.pt$", p.name))]
    return max(steps, default=-1)


def _wait_for(process, condition, timeout=240.0):
    start = time.monotonic()
    while not condition():
        assert process.poll() is None, f"the run ended before the moment to interrupt it:\n{process.stdout.read()}"
        assert time.monotonic() - start < timeout, "the moment to interrupt never came"
        time.sleep(0.0005)


def _weights(out):
    return checkpoint.load(out / "checkpoints" / "last.pt")["model"]


def _assert_identical(a, b):
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"parameters differ after resuming: {different[:5]}"


@pytest.fixture(scope="module")
def reference(tiny_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    process = _start(tiny_root, out)
    assert process.wait(timeout=300) == 0, process.stdout.read()
    return _weights(out)


def test_sigkill_anywhere_then_resume_is_bit_exact(tiny_root, tmp_path, reference):
    folder = tmp_path / "checkpoints"
    # 1. killed while a checkpoint is being written: a temporary file exists, the final name not yet
    first = _start(tiny_root, tmp_path)
    _wait_for(first, lambda: any(folder.glob(".step-*.tmp")))
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert checkpoint.latest(folder) is None or checkpoint.load(checkpoint.latest(folder))["step"] >= 0
    # 2. killed in the middle of the second epoch, just after a checkpoint
    second = _start(tiny_root, tmp_path)
    _wait_for(second, lambda: _newest_step(folder) >= 8)
    second.send_signal(signal.SIGKILL)
    second.wait()
    # 3. resumed to the end
    last = _start(tiny_root, tmp_path)
    output = last.communicate(timeout=300)[0]
    assert last.returncode == 0, output
    assert "resuming from" in output
    _assert_identical(_weights(tmp_path), reference)
    assert len(list(folder.glob("step-*.pt"))) == 2  # --keep-checkpoints 2
    assert not list(folder.glob(".*.tmp"))  # the half-written file of the first kill was cleared


def test_both_stop_signals_are_caught_while_training_and_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal to this process: it is recorded, not fatal
        assert signals.received == "SIGTERM"
        os.kill(os.getpid(), signal.SIGUSR1)
        assert signals.received == "SIGUSR1"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_signal_checkpoints_exits_99_and_resumes_exactly(tiny_root, tmp_path, reference):
    stop = signal.SIGUSR1  # what Slurm sends with --signal=USR1@...; SIGTERM takes the same path (above)
    folder = tmp_path / "checkpoints"
    process = _start(tiny_root, tmp_path)
    _wait_for(process, lambda: _newest_step(folder) >= 2)
    process.send_signal(stop)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == preemption.EXIT_CODE, output
    assert f"stopped by {stop.name}" in output and "--resume auto" in output
    marker = (tmp_path / preemption.MARKER).read_text()
    step = int(re.search(r"after step (\d+)", marker).group(1))
    assert checkpoint.load(folder / "last.pt")["step"] == step
    resumed = _start(tiny_root, tmp_path)
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read()
    assert not (tmp_path / preemption.MARKER).exists()
    _assert_identical(_weights(tmp_path), reference)


def test_last_checkpoint_is_the_newest_step(quick):
    train(**{**quick, "max_steps": 5}, checkpoint_every=1, keep_checkpoints=3)
    folder = os.path.join(quick["out"], "checkpoints")
    steps = sorted(name for name in os.listdir(folder) if name.startswith("step-"))
    assert len(steps) == 3
    assert os.path.samefile(os.path.join(folder, "last.pt"), os.path.join(folder, steps[-1]))


def test_a_checkpoint_of_another_model_is_refused_by_name(quick, tmp_path):
    train(**{**quick, "max_steps": 2})
    last = os.path.join(quick["out"], "checkpoints", "last.pt")
    before = checkpoint.load(last)["model"]
    with pytest.raises(ValueError, match="another training.*model: 'small_cnn' in the checkpoint, 'small_cnn_gn' now"):
        train(**quick, model="small_cnn_gn", resume="auto")
    _assert_identical(checkpoint.load(last)["model"], before)  # the refused run changed nothing on disk


def test_resume_of_a_missing_file_names_the_options(quick, tmp_path):
    with pytest.raises(FileNotFoundError, match="--resume auto"):
        train(**quick, resume=str(tmp_path / "nowhere.pt"))


def test_resuming_a_finished_run_says_so(quick):
    train(**{**quick, "max_steps": 2})
    with pytest.raises(ValueError, match="finished run"):
        train(**{**quick, "max_steps": 2}, resume="auto")


def test_a_diverging_run_stops_at_its_step_and_keeps_the_last_good_checkpoint(quick):
    with pytest.raises(NonFiniteLossError, match=r"became (nan|inf|inf or nan) by step \d+.*last good checkpoint"):
        train(**{**quick, "epochs": 3, "log_every": 1}, lr=1e6, checkpoint_every=1)
    state = checkpoint.load(os.path.join(quick["out"], "checkpoints", "last.pt"))
    assert all(torch.isfinite(value).all() for value in state["model"].values() if value.is_floating_point())
