"""Faults a cluster run meets, each made real with torchrun ranks, loader workers, signals to the whole process
group and files written by someone else: nothing already trained is lost, and nothing in a run folder runs
as code."""

import dataclasses
import io
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import sharded_runs
import torch

from course_utils import config
from course_utils.parallel.launch import LaunchResult, launch
from course_utils.run_folder import RunFolder
from course_utils.training import checkpoint, shard_files
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


def _ranks_of(agent: subprocess.Popen) -> list[int]:
    """torchrun's children: its ranks (each rank's loader workers are the rank's children, not these)."""
    deadline = time.monotonic() + 60
    while len(ranks := psutil.Process(agent.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    return [rank.pid for rank in ranks]


# (mode, signal, whom it reaches): Slurm's scancel and time limit signal every process of the job (the ranks,
# their loader workers, torchrun); `#SBATCH --signal=USR1@60` signals each task, the ranks, and not their workers.
STOPS = [("ddp", signal.SIGTERM, "the whole group"), ("fsdp", signal.SIGUSR1, "each rank")]


@pytest.mark.parametrize(("distributed", "stop", "whom"), STOPS, ids=[f"{mode} {stop.name} to {whom}"
                                                                      for mode, stop, whom in STOPS])
def test_a_stop_signal_with_loader_workers_checkpoints_and_resumes(tiny_root, tmp_path, distributed, stop, whom):
    """The loader workers leave the signal to their trainer, which agrees with the other ranks on a step,
    checkpoints (its shards under FSDP) and marks the run; the next run resumes it. Under FSDP a second run started
    in the busy folder first stops on every rank before reading a checkpoint, and damages nothing of the first."""
    folder = RunFolder(tmp_path / "run")
    # 1,000 epochs of 8 steps (minutes): far longer than any wait below, so only the signal stops the run.
    options = dict(size="ci", data_dir=str(tiny_root), model="small_cnn_gn", train_samples=256, test_samples=64,
                   batch_size=16, workers=2, log_every=1, device="cpu", progress=False, out=str(folder.path),
                   epochs=1000)
    agent = _torchrun(2, to_flags(**options, distributed=distributed, checkpoint_every=2, input_delay_ms=20))
    _wait_for_checkpoint(agent, folder, "step-*")
    if distributed == "fsdp":
        try:
            second = launch(2, "course_utils.train", *to_flags(**options, distributed=distributed, resume="auto"),
                            log_dir=tmp_path / "second-logs", echo=False, timeout_seconds=300)
            errors = [line for line in second.lines if line.startswith("[default") and "error:" in line]
            assert not second.ok and len(errors) == 2, "\n".join(second.lines[-30:])
            assert all("is in use by the run of process" in line for line in errors), "\n".join(errors)
            assert agent.poll() is None, "the first run ended before the second was refused"
        except BaseException:  # the first run would train its 1,000 epochs on: end it and its ranks
            os.killpg(agent.pid, signal.SIGTERM)  # torchrun passes it on to its ranks, in sessions of their own
            agent.communicate(timeout=180)
            raise
    if whom == "the whole group":
        os.killpg(agent.pid, stop)
    else:
        for rank in _ranks_of(agent):
            os.kill(rank, stop)
    output = agent.communicate(timeout=180)[0]
    assert "killed by signal" not in output, output[-3000:]
    assert f"stopped by {stop.name}" in output and "--resume auto" in output, output[-3000:]
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


LATE_RANK = """import os, sys, time
if os.environ["RANK"] == "1":
    time.sleep(1.5)  # this rank starts in a later second than rank 0, as one in four FSDP launches do
from course_utils.train import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_out_every_rank_writes_to_the_one_folder_rank_0_named(tiny_root, tmp_path, monkeypatch):
    """The default run folder is named from the clock: ranks that start on either side of a second would
    write their shards to two folders, and the checkpoint would lack a rank's shard."""
    monkeypatch.setenv(config.RUNS_VARIABLE, str(tmp_path / "runs"))
    script = tmp_path / "late_rank.py"
    script.write_text(LATE_RANK)
    flags = to_flags(size="ci", data_dir=str(tiny_root), model="small_cnn_gn", train_samples=256, test_samples=64,
                     batch_size=16, workers=0, device="cpu", progress=False, distributed="fsdp", max_steps=2)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folders = list((tmp_path / "runs").iterdir())
    assert len(folders) == 1, folders
    shards = checkpoint.candidates(RunFolder(folders[0]).checkpoints)[0]
    assert sorted(path.name for path in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def _launch(tiny_root, out, **extra) -> LaunchResult:
    return sharded_runs.launched(2, tiny_root, out, distributed="fsdp", **extra)


@pytest.fixture
def sharded_run(fsdp_run) -> Path:
    """The session's finished 2-rank FSDP run, sharded checkpoints at steps 2 and 4; copy it before changing it."""
    return fsdp_run[1]


def _skipped(run: Path, step: int, why: str) -> str:
    """The line a resume says for a checkpoint it passed over."""
    return f"skipped a checkpoint: {checkpoint.step_path(RunFolder(run).checkpoints, step, sharded=True)}{why}"


def test_a_forged_metadata_file_is_refused_and_never_runs(fsdp_resumed_past_damage):
    """Its checkpoint is one of those the session's damaged copy passes over (``sharded_runs``)."""
    result, run, ran = fsdp_resumed_past_damage
    lines = "\n".join(result.lines)
    assert not ran.exists(), "the forged .metadata ran on resume"
    assert result.ok, lines[-3000:]
    assert _skipped(run, sharded_runs.FORGED_METADATA_STEP, " is not a whole sharded checkpoint: .metadata refers "
                                                            "to builtins.exec") in lines, lines[-3000:]
    assert "resuming from" in lines and "step-00000002.dcp: step 2" in lines


def test_a_forged_item_in_a_shard_file_is_refused_and_never_runs(sharded_run, tiny_root, tmp_path):
    """A shard's non-tensor item (the optimizer's learning rate) replaced by an object whose unpickling writes a
    file, and the metadata pointed at it, as someone with write access to the run folder could do."""
    run = sharded_runs.unfinished_copy(sharded_run, tmp_path / "run")
    newest = checkpoint.step_path(run.checkpoints, 4, sharded=True)
    ran = tmp_path / "ran"
    metadata = shard_files.read_metadata(newest)
    index, info = next((index, info) for index, info in metadata.storage_data.items()
                       if index.fqn == "optimizer.param_groups.0.lr")
    payload = io.BytesIO()
    torch.save(sharded_runs.WritesAFile(ran), payload)
    shard = newest / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as stream:
        stream.write(payload.getvalue())
    metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(payload.getvalue()))
    (newest / checkpoint.SHARDED_METADATA).write_bytes(pickle.dumps(metadata))
    named = _launch(tiny_root, run.path, max_steps=5, resume=str(newest))
    lines = "\n".join(named.lines)
    assert not ran.exists(), "the forged item ran on resume"
    assert not named.ok and "its item optimizer.param_groups.0.lr holds objects other than tensors" in lines, lines
    ranks = [line for line in named.lines if line.startswith("[default")]  # torchrun adds a report of its own
    assert not any("Traceback" in line for line in ranks), lines[-3000:]


# What the resume says of each damage, after its checkpoint's name.
PASSED_OVER = {"missing": " is not a whole sharded checkpoint: its shard file __1_0.distcp is missing",
               "truncated": " is not a whole sharded checkpoint: its shard file __1_0.distcp is truncated",
               "corrupted": ": its shards do not load"}


@pytest.mark.parametrize("damage", list(sharded_runs.SHARD_DAMAGE))
def test_a_damaged_shard_is_passed_over_for_the_newest_whole_checkpoint(fsdp_resumed_past_damage, damage):
    """Each damage lies in a checkpoint of its own in the session's damaged copy (``sharded_runs``), all of them
    newer than step 2: the one resume names each it passed over and continues from step 2."""
    result, run, _ = fsdp_resumed_past_damage
    lines = "\n".join(result.lines)
    assert result.ok, lines[-3000:]
    step, _ = sharded_runs.SHARD_DAMAGE[damage]
    assert _skipped(run, step, PASSED_OVER[damage]) in lines, lines[-3000:]
    assert "resuming from" in lines and "step-00000002.dcp: step 2" in lines
    assert RunFolder(run).read_summary()["steps"] == 5
