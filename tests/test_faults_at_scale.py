"""Faults a cluster run meets, each made real with torchrun ranks, loader workers, signals to the whole process
group and files written by someone else: nothing already trained is lost, and nothing in a run folder runs
as code."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from course_utils.run_folder import RunFolder
from course_utils.training import checkpoint
from course_utils.training.options import to_flags

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _torchrun(ranks: int, flags: list[str]) -> subprocess.Popen:
    """torchrun and its ranks in a process group of their own, as ``srun`` or a terminal starts them."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m",
               "course_utils.train", *flags]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _wait_for_checkpoint(agent: subprocess.Popen, folder: RunFolder, pattern: str) -> None:
    deadline = time.monotonic() + 240
    while not list(folder.checkpoints.glob(pattern)):
        assert agent.poll() is None and time.monotonic() < deadline, agent.stdout.read()[-3000:]
        time.sleep(0.2)


def _stopped_step(folder: RunFolder) -> int:
    return int(re.search(r"after step (\d+)", folder.preempted.read_text()).group(1))


@pytest.mark.parametrize("distributed", ["ddp", "fsdp"])
def test_sigterm_to_the_whole_group_with_loader_workers_checkpoints_and_resumes(tiny_root, tmp_path, distributed):
    """Slurm's scancel, time limit and preemption signal every process of the job, the DataLoader workers of
    every rank included: the workers leave the signal to their trainer, which checkpoints and marks the run."""
    folder = RunFolder(tmp_path / "run")
    options = dict(size="ci", data_dir=str(tiny_root), model="small_cnn_gn", train_samples=256, test_samples=64,
                   batch_size=16, workers=2, log_every=1, device="cpu", progress=False, out=str(folder.path))
    agent = _torchrun(2, to_flags(**options, distributed=distributed, max_steps=400, checkpoint_every=2,
                                  input_delay_ms=20))
    _wait_for_checkpoint(agent, folder, "step-*")
    os.killpg(agent.pid, signal.SIGTERM)
    output = agent.communicate(timeout=180)[0]
    assert "killed by signal" not in output, output[-3000:]
    assert folder.preempted.is_file(), output[-3000:]
    step = _stopped_step(folder)
    newest = checkpoint.candidates(folder.checkpoints)[0]
    assert checkpoint.load(newest)["step"] == step, output[-3000:]
    resumed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                              "-m", "course_utils.train", *to_flags(**options, distributed=distributed,
                                                                    max_steps=step + 2, resume="auto")],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"step {step}" in resumed.stdout + resumed.stderr and folder.read_summary()["steps"] == step + 2

