"""Notebook 12's crash and restart: a rank killed mid-run, torchrun restarting the job, the run resuming from its
checkpoint on its own to the weights of a run never killed, and the time lost read from its records; nothing of
the launch left running."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from course_utils.doctor import comm_failures
from course_utils.experiments.runs import run_ranks
from course_utils.lessons import crash_restart
from course_utils.train import train
from course_utils.training.options import to_flags

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _options(tiny_root: Path) -> dict:
    return dict(size="ci", data_dir=str(tiny_root), model="small_cnn_gn", train_samples=256, test_samples=32,
                epochs=2, batch_size=8, workers=2, log_every=1, checkpoint_every=4, device="cpu")


@pytest.fixture(scope="module")
def crashed(tiny_root, tmp_path_factory):
    """One launch whose rank 1 is killed after step 11 and which torchrun restarts, with what it cost: the cost's
    test and the restart's read it (each launch of two ranks, restarted, costs tens of CPU seconds)."""
    out = tmp_path_factory.mktemp("crashed") / "crash"
    return out, *crash_restart.crash_and_restart(out, crash_at=11, **_options(tiny_root))


def test_a_killed_rank_costs_the_steps_since_the_checkpoint_and_the_restart(crashed):
    """Loader workers run beside each rank: the dead rank's workers must not keep the job alive."""
    out, result, lost = crashed
    assert result.ok and result.summary["steps"] == 32
    assert re.search(r"exitcode\s*: -9\)? local_rank: 1", "\n".join(result.lines))  # torchrun saw rank 1 killed
    assert (lost.rank, lost.crashed_at, lost.resumed_from, lost.last_logged, lost.lost_steps) == (1, 11, 8, 11, 3)
    # The watcher looks every 20 ms: on a busy machine it may see the three redone steps at one look (redo 0 s).
    assert lost.restart_seconds > 0 and lost.redo_seconds >= 0
    assert lost.restart_seconds < 120  # rank 0 did not wait out the 600 s collective timeout for the dead rank
    assert abs(lost.lost_seconds - (lost.restart_seconds + lost.redo_seconds)) < 1e-6
    assert comm_failures.diagnose("\n".join(result.lines)).cause.name == "rank_killed"  # the doctor's --log
    text = crash_restart.answer(lost, result)
    assert "**3 steps**" in text and "step **8**" in text and "after step **11**" in text
    left = [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not left


@pytest.mark.oldest
def test_torchrun_restarts_from_the_last_checkpoint(crashed, tiny_root, tmp_path, run_weights):
    """The restarted ranks end with the weights of the same run never killed: every rank loaded rank 0's file."""
    out, result, _ = crashed
    assert any("resuming from" in line for line in result.lines)
    reference = tmp_path / "reference"
    run_ranks(2, reference, timeout_seconds=300, **_options(tiny_root))
    final, expected = run_weights(out), run_weights(reference)
    assert all(torch.equal(final[name], expected[name]) for name in expected)


def test_a_crash_without_a_checkpoint_to_resume_from_says_so(tiny_root, tmp_path):
    out = tmp_path / "crash"
    with pytest.raises(ValueError, match="resuming from"):  # killed before the first checkpoint: it starts afresh
        crash_restart.crash_and_restart(out, crash_at=2, size="ci", data_dir=str(tiny_root), model="small_cnn_gn",
                                        train_samples=128, test_samples=32, epochs=1, batch_size=8, workers=0,
                                        log_every=1, checkpoint_every=6, device="cpu")


def test_a_drill_step_the_run_never_trains_is_refused_before_any_step(quick):
    with pytest.raises(ValueError, match=r"--crash-at-step 99 is past the run's last step \(16\)"):
        train(**quick, crash_at_step=99)
    assert not (Path(quick["out"]) / "checkpoints").exists()
    with pytest.raises(ValueError, match=r"past the run's last step \(5\): choose a step the run trains, or raise "
                                         r"--max-steps"):
        train(**quick, max_steps=5, crash_at_step=9)  # --max-steps set the limit: raising --epochs would not help


def _drill(tiny_root: Path, out: Path, env: dict[str, str] | None = None, **extra) -> subprocess.CompletedProcess:
    """The training command with the drill at step 3, as one process (it is its own last rank)."""
    flags = to_flags(size="ci", data_dir=str(tiny_root), model="small_cnn", train_samples=128, test_samples=32,
                     epochs=1, batch_size=16, workers=2, log_every=1, checkpoint_every=2, device="cpu",
                     progress=False, crash_at_step=3, out=str(out), **extra)
    return subprocess.run([sys.executable, "-m", "course_utils.train", *flags], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_the_drill_fires_once_whatever_starts_the_run_again(tiny_root, tmp_path):
    """The first attempt dies at the drill step; continued by hand with --resume auto it trains on (before, it died
    at the same step on every attempt); a new run in the folder drills again."""
    out = tmp_path / "run"
    first = _drill(tiny_root, out, resume="auto")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    again = _drill(tiny_root, out, resume="auto")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from" in again.stdout + again.stderr
    assert "the crash drill does not fire again" in again.stdout + again.stderr
    assert _drill(tiny_root, out, overwrite=True).returncode == -signal.SIGKILL  # a new run, not another attempt


def test_a_slurm_requeue_is_not_the_first_attempt(tiny_root, tmp_path):
    """Slurm sets SLURM_RESTART_COUNT on a requeued job (torchrun's own counter is then unset): no drill."""
    requeued = _drill(tiny_root, tmp_path / "run", env={"SLURM_RESTART_COUNT": "1"})
    assert requeued.returncode == 0, requeued.stderr[-2000:]
