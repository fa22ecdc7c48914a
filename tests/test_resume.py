"""Nothing lost: runs killed at arbitrary moments, or asked to stop by a signal, resume bit for bit."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from course_utils.lessons import ddp
from course_utils.observe.metrics import load_run
from course_utils.run_folder import RunFolder
from course_utils.train import main, train
from course_utils.training import checkpoint, preemption
from course_utils.training.folder_hold import FolderInUse
from course_utils.training.options import to_flags
from course_utils.training.preemption import StopSignals
from course_utils.training.resume import NonFiniteLossError

# Augmentation and a worker process make the replay non-trivial: the resumed run must draw the same
# random crops and flips as the uninterrupted one.
FLAGS = ["--size", "ci", "--model", "small_cnn", "--train-samples", "96", "--test-samples", "32", "--epochs", "2",
         "--batch-size", "16", "--workers", "1", "--log-every", "2", "--checkpoint-every", "2", "--no-progress",
         "--device", "cpu"]
# A run finds this as sitecustomize.py first on its PYTHONPATH and runs it at start-up: every fsync then waits
# half a second, so a checkpoint stays mid-write (temporary file written, not yet renamed) long enough to kill.
SLOW_FSYNC = '''\
import os
import time

_fsync = os.fsync


def _slow_fsync(fd):
    time.sleep(0.5)
    _fsync(fd)


os.fsync = _slow_fsync
'''


def _start(tiny_root, out, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "course_utils.train", *FLAGS, "--data-dir", str(tiny_root),
                             "--out", str(out), "--resume", "auto"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


@pytest.fixture
def slow_writes(tmp_path_factory) -> dict[str, str]:
    """An environment whose runs write checkpoints slowly (``SLOW_FSYNC``): the test kills one mid-write with
    a sensible polling interval instead of spinning to catch a window of milliseconds."""
    folder = tmp_path_factory.mktemp("slow-writes")
    (folder / "sitecustomize.py").write_text(SLOW_FSYNC)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def _newest_step(folder) -> int:
    steps = [int(m.group(1)) for p in folder.glob("step-*.pt") if (m := re.match(r"step-(\d+)\.pt$", p.name))]
    return max(steps, default=-1)


def _step_being_written(folder) -> int:
    """The step whose checkpoint has a temporary file and no final name yet, or -1."""
    steps = [int(m.group(1)) for p in folder.glob(".step-*.tmp") if (m := re.match(r"\.step-(\d+)\.pt\.", p.name))]
    return max(steps, default=-1)


def _wait_for(process: subprocess.Popen, condition, what: str, timeout: float = 240.0, interval: float = 0.05) -> None:
    """Poll ``condition`` every ``interval`` seconds while the run goes on; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended before {what}:\n{process.stdout.read()}"
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:.0f} s"
        time.sleep(interval)


def _assert_identical(a, b):
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"parameters differ after resuming: {different[:5]}"


@pytest.fixture(scope="module")
def reference(tiny_root, tmp_path_factory, run_weights):
    out = tmp_path_factory.mktemp("reference")
    process = _start(tiny_root, out)
    assert process.wait(timeout=300) == 0, process.stdout.read()
    return run_weights(out)


@pytest.mark.slow
def test_sigkill_anywhere_then_resume_is_bit_exact(tiny_root, tmp_path, reference, slow_writes, run_weights):
    folder = RunFolder(tmp_path).checkpoints
    # 1. killed while a checkpoint is being written: a temporary file exists, the final name not yet
    first = _start(tiny_root, tmp_path, env=slow_writes)
    _wait_for(first, lambda: _step_being_written(folder) >= 4, "the write of a second checkpoint")
    first.send_signal(signal.SIGKILL)
    first.wait()
    writing = _step_being_written(folder)
    assert writing >= 4 and not checkpoint.step_path(folder, writing).exists(), "the kill came after the write"
    state = checkpoint.load(checkpoint.candidates(folder)[0])  # the previous checkpoint is whole: it loads
    assert state["step"] == _newest_step(folder) < writing and state["step"] > 0
    # 2. killed in the middle of the second epoch, just after a checkpoint
    second = _start(tiny_root, tmp_path)
    _wait_for(second, lambda: _newest_step(folder) >= 8, "a checkpoint in the second epoch")
    second.send_signal(signal.SIGKILL)
    second.wait()
    # 3. resumed to the end
    last = _start(tiny_root, tmp_path)
    output = last.communicate(timeout=300)[0]
    assert last.returncode == 0, output
    assert "resuming from" in output and "starting from the beginning" not in output
    _assert_identical(run_weights(tmp_path), reference)
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
    assert preemption.received_while_training() == "SIGUSR1"  # read after the loop failed: wait for no rank
    with StopSignals():
        assert preemption.received_while_training() is None  # a new run starts unsignalled


@pytest.mark.oldest
@pytest.mark.slow
def test_a_stop_signal_checkpoints_exits_99_and_resumes_exactly(tiny_root, tmp_path, reference, run_weights):
    stop = signal.SIGUSR1  # what Slurm sends with --signal=USR1@...; SIGTERM takes the same path (above)
    run = RunFolder(tmp_path)
    process = _start(tiny_root, tmp_path)
    _wait_for(process, lambda: _newest_step(run.checkpoints) >= 2, "the first checkpoint")
    process.send_signal(stop)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == preemption.EXIT_CODE, output
    assert f"stopped by {stop.name}" in output and "--resume auto" in output
    marker = run.preempted.read_text()
    step = int(re.search(r"after step (\d+)", marker).group(1))
    assert checkpoint.load(run.last_checkpoint)["step"] == step
    resumed = _start(tiny_root, tmp_path)
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read()
    assert not run.preempted.exists()
    _assert_identical(run_weights(tmp_path), reference)


@pytest.mark.slow
def test_a_run_continued_with_a_higher_max_steps_trains_as_one_never_stopped(quick, tmp_path, run_weights):
    """--max-steps stops early, mid-epoch too; each continuation trains the steps that are left, on the same
    learning-rate schedule, and reports each epoch once."""
    straight = train(**{**quick, "out": str(tmp_path / "straight")})
    for max_steps in (5, 11, None):  # into epoch 1, into epoch 2, to the end of --epochs
        summary = train(**quick, max_steps=max_steps, resume="auto" if max_steps != 5 else None)
    assert summary["steps"] == straight["steps"] and math.isfinite(summary["images_per_second"])
    _assert_identical(run_weights(quick["out"]), run_weights(tmp_path / "straight"))
    epochs = load_run(quick["out"]).epochs
    assert epochs["epoch"].tolist() == [1, 2] and epochs["steps"].tolist() == [8, 8]


def test_last_checkpoint_is_the_newest_step(quick):
    train(**{**quick, "max_steps": 5}, checkpoint_every=1, keep_checkpoints=3)
    run = RunFolder(quick["out"])
    steps = sorted(run.checkpoints.glob("step-*.pt"))
    assert len(steps) == 3
    assert checkpoint.load(run.last_checkpoint)["step"] == checkpoint.load(steps[-1])["step"] == 5


def test_resume_auto_passes_over_damaged_checkpoints_to_the_newest_good_one(quick, capsys):
    train(**{**quick, "max_steps": 6}, checkpoint_every=2, keep_checkpoints=3)
    folder = RunFolder(quick["out"]).checkpoints
    newest = checkpoint.step_path(folder, 6)
    newest.write_bytes(bytes(newest.stat().st_size))  # zero-filled in place
    last = folder / "last.pt"
    last.write_bytes(last.read_bytes()[:100])  # truncated
    summary = train(**{**quick, "max_steps": 8}, resume="auto")
    assert summary["resumed_from"] == str(checkpoint.step_path(folder, 4))
    said = capsys.readouterr().out
    assert f"skipped a checkpoint: {last} is damaged" in said and f"skipped a checkpoint: {newest} is damaged" in said


def test_a_damaged_checkpoint_named_on_the_command_line_is_one_clear_line(quick, capsys):
    train(**{**quick, "max_steps": 2})
    last = RunFolder(quick["out"]).last_checkpoint
    last.write_bytes(b"")
    flags = to_flags(**{**quick, "max_steps": 4}, resume=str(last))
    assert main(flags) == 1
    error = capsys.readouterr().err.strip()
    assert error == f"error: {last} is damaged: 0 bytes that are not a whole PyTorch checkpoint (truncated, " \
                    "overwritten, or not a checkpoint at all)"


@pytest.mark.slow
def test_a_second_run_in_a_held_folder_refuses_and_a_dead_holder_does_not_block(tiny_root, tmp_path):
    run = RunFolder(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "course_utils.train", *FLAGS, "--data-dir", str(tiny_root),
                              "--out", str(tmp_path), "--input-delay-ms", "200", "--workers", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run.hold.is_file() and f"process {first.pid}" in run.hold.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never took the folder"
            time.sleep(0.2)
        with pytest.raises(FolderInUse, match=f"{tmp_path} is in use by the run of process {first.pid} on "):
            train(size="ci", data_dir=str(tiny_root), out=str(tmp_path), max_steps=2, progress=False, device="cpu",
                  monitor="cpu")
        assert not run.monitor.exists(), "the refused run sampled into the other run's folder"
    finally:
        first.kill()
        first.wait()
    summary = train(size="ci", data_dir=str(tiny_root), train_samples=64, test_samples=32, batch_size=16,
                    out=str(tmp_path), epochs=1, progress=False, device="cpu", overwrite=True)
    assert summary["steps"] == 4 and not run.preempted.exists()


def test_a_checkpoint_of_another_model_is_refused_by_name(quick, tmp_path):
    train(**{**quick, "max_steps": 2})
    last = RunFolder(quick["out"]).last_checkpoint
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


def test_a_run_whose_summary_was_lost_at_its_last_step_gets_it_from_resume_auto(quick, capsys):
    """A full disk when ``summary.json`` is written leaves the folder as below (the write is atomic: no file);
    what the error and a plain rerun advise, ``--resume auto``, writes it without training again."""
    finished = train(**quick)
    folder = RunFolder(quick["out"])
    folder.summary.unlink()
    assert main(to_flags(**quick)) == 1
    assert "continue it with --resume auto" in capsys.readouterr().err
    summary = train(**quick, resume="auto")
    assert "nothing left to train" in capsys.readouterr().out
    assert json.loads(folder.summary.read_text())["steps"] == summary["steps"] == finished["steps"]
    for name in ("final_train_loss", "test_loss", "test_top1", "epoch_seconds", "first_epoch_seconds"):
        assert summary[name] == finished[name], name
    assert summary["resumed_from"] == str(folder.last_checkpoint) and summary["images_per_second"] != summary[
        "images_per_second"]  # NaN: this process timed no step, it reports none
    with pytest.raises(ValueError, match="finished run"):  # and now it is finished
        train(**quick, resume="auto")


def test_a_run_at_its_last_step_without_its_last_epoch_s_record_says_what_is_lost(quick):
    train(**quick)
    folder = RunFolder(quick["out"])
    folder.summary.unlink()
    records = folder.metrics.read_text().splitlines()
    folder.metrics.write_text("\n".join(records[:-1]) + "\n")  # the disk filled at the last epoch's record
    with pytest.raises(ValueError, match="its last epoch's record and its summary were never written.*--overwrite"):
        train(**quick, resume="auto")


@pytest.mark.parametrize(("change", "told"), [
    (lambda state: state.pop("config"), "no config"),
    (lambda state: state.update(ranks=[]), "its ranks list holds 0 entries for a world size of 1"),
    (lambda state: state.update(epoch="3"), "its epoch is not a whole number"),
    (lambda state: state["config"].pop("batch_size"), "its config has no batch_size"),
])
def test_a_checkpoint_that_loads_but_lacks_what_a_resume_reads_is_one_clear_line(quick, capsys, change, told):
    train(**{**quick, "max_steps": 2}, checkpoint_every=1)
    folder = RunFolder(quick["out"])
    state = checkpoint.load(folder.last_checkpoint)
    change(state)
    torch.save(state, folder.last_checkpoint)  # changed by hand, or written by another program
    assert main(to_flags(**{**quick, "max_steps": 4}, resume=str(folder.last_checkpoint))) == 1
    error = capsys.readouterr().err.strip()
    assert error == (f"error: {folder.last_checkpoint} loads but is not a whole checkpoint of this course's training "
                     f"command ({told}): written by another program or changed by hand; resume from another "
                     "checkpoint (--resume auto passes over it), or start anew with --overwrite")
    summary = train(**{**quick, "max_steps": 4}, resume="auto")  # what --resume auto does: the step file before it
    assert summary["resumed_from"] == str(checkpoint.step_path(folder.checkpoints, 2))
    assert f"skipped a checkpoint: {folder.last_checkpoint} loads but is not a whole checkpoint" in capsys.readouterr(
        ).out


def test_a_checkpoint_past_the_end_of_this_run_s_epoch_says_the_data_differ(quick, capsys):
    train(**{**quick, "max_steps": 6})  # 8 steps per epoch: stopped 6 steps into the first
    last = RunFolder(quick["out"]).last_checkpoint
    state = checkpoint.load(last)
    state["epoch_step"] = 20  # as a run on more data would have written it
    torch.save(state, last)
    assert main(to_flags(**{**quick, "max_steps": 10}, resume="auto")) == 1
    assert capsys.readouterr().err.strip() == (
        f"error: {last} stopped 20 steps into epoch 1, but an epoch of this run has 8 steps: its training data is "
        f"smaller than the data of the run that wrote it (--data-dir {quick['data_dir']}); resume on the same data, "
        "or start a new run with another --out")


def test_a_diverging_run_stops_at_its_step_and_keeps_the_last_good_checkpoint(quick):
    with pytest.raises(NonFiniteLossError, match=r"became (nan|inf|inf or nan) by step \d+.*last good checkpoint"):
        train(**{**quick, "epochs": 3, "log_every": 1}, lr=1e6, checkpoint_every=1)
    state = checkpoint.load(RunFolder(quick["out"]).last_checkpoint)
    assert all(torch.isfinite(value).all() for value in state["model"].values() if value.is_floating_point())


@pytest.mark.slow
def test_the_lessons_interrupted_run_is_stopped_however_fast_it_trains(tiny_root, tmp_path):
    """Notebook 07's interrupted run: paced in its loader, a run of eight short steps (a GPU trains them in a
    blink) is stopped after its checkpoint at step 2, and the resumed run finishes it at full speed."""
    options = dict(size="ci", data_dir=str(tiny_root), train_samples=256, test_samples=64, batch_size=32, epochs=1,
                   checkpoint_every=2, log_every=2, device="cpu")
    stopped = ddp.interrupted_run(tmp_path, stop_after_step=2, **options)
    assert stopped["exit_code"] == preemption.EXIT_CODE and "stopped by SIGUSR1" in stopped["marker"]
    resumed = train(out=str(tmp_path), resume="auto", progress=False, **options)
    assert resumed["steps"] == 8 and resumed["resumed_from"]
