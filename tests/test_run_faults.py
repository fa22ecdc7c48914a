"""Faults a run meets where learners work, each made real: an unfinished run in the folder, changed settings
on resume, values that make no sense, a folder that cannot take checkpoints, a full disk, Ctrl-C, and a
vendor tool that hangs or prints garbage. The run either refuses before its first step, in one line that
names the fix, or goes on; nothing already written is lost."""

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from course_utils import config
from course_utils.observe.metrics import MetricsWriter, read_records
from course_utils.parallel.launch import launch
from course_utils.run_folder import RunFolder
from course_utils.train import describe_error, main, train
from course_utils.training import checkpoint, preemption
from course_utils.training.options import to_flags
from course_utils.training.preemption import StopSignals
from course_utils.training.resume import NonFiniteLossError

NVIDIA_SMI = (Path(__file__).parent / "fixtures" / "monitor" / "nvidia-smi_a100_nounits.csv").read_text()


def test_a_new_run_does_not_delete_an_unfinished_run_unless_told(quick, capsys):
    with pytest.raises(NonFiniteLossError):  # a run that crashed: checkpoints, no summary
        train(**{**quick, "epochs": 3, "log_every": 1}, lr=1e6, checkpoint_every=1)
    folder = RunFolder(quick["out"])
    kept = {path.name: path.read_bytes() for path in checkpoint.candidates(folder.checkpoints)}
    assert kept and not folder.summary.exists()
    assert main(to_flags(**quick)) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {folder.path} holds a run that did not finish")
    assert "--resume auto" in error and "another --out" in error and "--overwrite" in error
    assert {path.name: path.read_bytes() for path in checkpoint.candidates(folder.checkpoints)} == kept
    summary = train(**quick, overwrite=True)
    assert summary["steps"] > 0 and "the earlier run's checkpoints were removed" in capsys.readouterr().out
    train(**quick)  # a finished run is replaced without being told


def test_a_resumed_run_refuses_other_optimization_settings_by_name(quick):
    train(**{**quick, "max_steps": 2})
    for changed, text in (({"lr": 0.5}, "lr: 0.05 in the checkpoint, 0.5 now"),
                          ({"weight_decay": 0.0}, "weight_decay: 0.0005 in the checkpoint, 0.0 now"),
                          ({"augment": False}, "augment: True in the checkpoint, False now")):
        with pytest.raises(ValueError, match=f"another training.*{text}"):
            train(**quick, resume="auto", **changed)
    assert train(**quick, resume="auto")["steps"] == 16  # more steps, same settings: continues


def test_values_that_make_no_sense_are_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--size", "ci", "--epochs", "-1", "--log-every", "0", "--keep-checkpoints", "0", "--test-samples",
                 "0", "--monitor-interval", "0", "--out", str(out)]) == 1
    error = capsys.readouterr().err.strip()
    assert error == ("error: --epochs must be at least 1, not -1; --test-samples must be at least 1, not 0; "
                     "--log-every must be at least 1, not 0; --monitor-interval must be above 0, not 0.0; "
                     "--keep-checkpoints must be at least 1, not 0")
    assert not out.exists()


def test_a_folder_that_cannot_take_checkpoints_is_found_before_the_first_step(quick, capsys):
    folder = RunFolder(quick["out"])
    folder.path.mkdir(parents=True)
    folder.checkpoints.write_text("a file where the checkpoints folder belongs")
    assert main(to_flags(**quick)) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: checkpoints cannot be written in {folder.checkpoints} (")
    assert error.endswith("make it a writable folder or choose another --out")
    assert not folder.metrics.exists()  # no step was trained


@pytest.mark.parametrize(("chosen_by", "fix"), [
    ("--out", "choose another --out"),
    (config.RUNS_VARIABLE, "point COURSE_RUNS_DIR (now {file}) at another folder"),
    (config.DATA_VARIABLE, "point COURSE_DATA_DIR (now {file}) at another folder"),
])
def test_a_file_where_a_folder_belongs_is_named_with_the_option_or_variable_that_chose_it(
        quick, tmp_path, monkeypatch, capsys, chosen_by, fix):
    """An --out that is a file said "File exists", a COURSE_RUNS_DIR that is one "Not a directory" and a
    COURSE_DATA_DIR that is one advised to prepare the data under it, which cannot work."""
    file = tmp_path / "scratch"
    file.write_text("a file where a folder belongs")
    run = {**quick, "out": str(file)}
    if chosen_by != "--out":
        monkeypatch.setenv(chosen_by, str(file))
        run.pop("data_dir" if chosen_by == config.DATA_VARIABLE else "out")
    assert main(to_flags(**run)) == 1
    assert capsys.readouterr().err.strip() == (f"error: {file} is a file where a folder belongs: move it away or "
                                               f"{fix.format(file=file)}")
    assert file.read_text() == "a file where a folder belongs"


def test_a_run_without_out_takes_a_folder_of_its_own_beside_a_run_of_the_same_second(quick, tmp_path,
                                                                                    monkeypatch):
    """The default folder is named from the clock: a run started in the same second as another shared its folder,
    and refused ("choose another --out") or replaced the other's files. Here every second this run could start in
    has its folder already, as another run would have made it."""
    runs = tmp_path / "runs"
    monkeypatch.setenv(config.RUNS_VARIABLE, str(runs))
    now = datetime.now()
    taken = [runs / f"small_cnn-{now + timedelta(seconds=second):%Y%m%d-%H%M%S}" for second in range(-1, 120)]
    for folder in taken:
        folder.mkdir(parents=True)
        (folder / "theirs").write_text("another run's")
    out = Path(train(**{**quick, "out": None, "max_steps": 2})["out"])
    assert out.parent == runs and out.name.endswith("-2") and out.with_name(out.name.removesuffix("-2")) in taken
    assert RunFolder(out).read_summary()["steps"] == 2
    assert all([path.name for path in folder.iterdir()] == ["theirs"] for folder in taken)


def test_a_metrics_line_cut_short_by_a_full_disk_is_left_out_and_others_are_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "step", "step": 1}\n{"kind": "step", "st')
    assert read_records(path) == [{"kind": "step", "step": 1}]
    path.write_text('{"kind": "step", "st\n{"kind": "step", "step": 2}\n')
    with pytest.raises(ValueError, match="line 1, is not a metrics record"):
        read_records(path)


@pytest.mark.slow
def test_a_full_disk_says_so_and_keeps_the_last_good_checkpoint(quick, tmp_path, small_disk, capsys):
    train(**{**quick, "max_steps": 1, "out": str(tmp_path / "probe")})
    size = RunFolder(tmp_path / "probe").last_checkpoint.stat().st_size
    # Room for the first checkpoint (step file and last.pt), the metrics and half of the next checkpoint.
    disk = small_disk(int(2.5 * size) + 256 * 1024)
    out = disk / "run"
    assert main(to_flags(**{**quick, "max_steps": 8, "out": str(out)}, checkpoint_every=1)) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: disk full writing {out / 'checkpoints'}/step-") and "--resume auto" in error
    last = checkpoint.load(RunFolder(out).last_checkpoint)
    assert last["step"] >= 1 and not checkpoint.step_path(RunFolder(out).checkpoints, last["step"] + 1).exists()
    assert not list(RunFolder(out).checkpoints.glob(".*.tmp"))  # the half-written file is gone


# What a run of one checkpoint makes, its summary aside: the file system's root, the run's folder, .hold,
# metrics.jsonl, tensorboard/ and its events, checkpoints/ with step-N.pt and last.pt.
FILES_BEFORE_THE_SUMMARY = 9


@pytest.mark.slow
def test_a_full_disk_at_the_summary_says_the_training_finished_and_resume_auto_writes_it(quick, small_disk, capsys):
    """The summary is a run's last file. A file system full by then (here: out of room for files) was answered
    with another --out or --resume auto "from the last checkpoint": the first gives no summary at all. What the
    message says now is what works: after room is made, --resume auto writes the summary without training."""
    disk = small_disk(64 << 20, inodes=FILES_BEFORE_THE_SUMMARY)
    run = {**quick, "epochs": 1, "out": str(disk / "run")}
    folder = RunFolder(run["out"])
    assert main(to_flags(**run)) == 1
    assert capsys.readouterr().err.strip() == (
        f"error: the training finished (8 steps): its checkpoints in {folder.checkpoints} and its metrics are whole, "
        f"but {folder.summary} could not be written (No space left on device); make room there, then the same "
        "command with --resume auto writes the summary from the metrics without training again (with no "
        "throughput: only this process timed the steps; --overwrite trains it again to measure it)")
    small_disk(64 << 20, inodes=FILES_BEFORE_THE_SUMMARY + 8)
    assert main(to_flags(**run, resume="auto")) == 0
    assert "nothing left to train" in capsys.readouterr().out and folder.read_summary()["steps"] == 8


@pytest.mark.slow
def test_a_full_disk_at_the_summary_of_a_run_that_ended_mid_epoch_says_to_train_it_again(quick, small_disk, capsys):
    """A run stopped by --max-steps mid-epoch has a partial last epoch, which --resume auto cannot summarize: the
    message does not send the learner there."""
    disk = small_disk(64 << 20, inodes=FILES_BEFORE_THE_SUMMARY)
    run = {**quick, "max_steps": 5, "out": str(disk / "run")}
    assert main(to_flags(**run)) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: the training finished (5 steps)") and error.endswith(
        "its last epoch ended mid-way (--max-steps), which only the process that trained it can summarize: make "
        "room there and train it again with --overwrite")
    small_disk(64 << 20, inodes=FILES_BEFORE_THE_SUMMARY + 8)
    with pytest.raises(ValueError, match="nothing to summarize"):
        train(**run, resume="auto")
    assert train(**run, overwrite=True)["steps"] == 5


def _fill(disk: Path) -> None:
    """Take every free byte of ``disk``."""
    handle = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as full:
            while True:
                os.write(handle, b"\0" * 65536)
    finally:
        os.close(handle)
    assert full.value.errno == errno.ENOSPC


def test_a_full_disk_at_tensorboard_s_write_names_the_file_without_a_thread_s_traceback(small_disk, capfd):
    folder = RunFolder(small_disk(256 * 1024) / "run")
    writer = MetricsWriter(folder.path)
    writer.record({"kind": "step"}, {"train/loss": 1.0}, 1)  # the metrics and the events have a page each
    _fill(folder.path.parent)
    scalars = {f"train/value_{index}": float(index) for index in range(20)}  # the events outgrow their page first
    with pytest.raises(OSError) as full:
        for step in range(2, 10_000):
            writer.record({"kind": "step"}, scalars, step)
    with contextlib.suppress(OSError):
        writer.close()
    assert full.value.errno == errno.ENOSPC and Path(full.value.filename).parent == folder.tensorboard
    assert describe_error(full.value).startswith(f"disk full writing {full.value.filename}: free space there")
    assert "Traceback" not in capfd.readouterr().err


def test_a_second_ctrl_c_stops_at_once():
    before = signal.getsignal(signal.SIGINT)
    with StopSignals(announce=False) as signals:
        os.kill(os.getpid(), signal.SIGINT)  # the first is recorded: the loop checkpoints and leaves
        assert signals.received == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
def test_ctrl_c_checkpoints_like_a_stop_signal_with_loader_workers(quick, tiny_root, tmp_path):
    """Ctrl-C in a terminal reaches the whole process group, the DataLoader workers too: they leave it to the
    trainer, which finishes its step, checkpoints and exits 99."""
    out = RunFolder(tmp_path / "run")
    flags = to_flags(**{**quick, "workers": 1, "epochs": 5, "out": str(out.path)}, checkpoint_every=2,
                     input_delay_ms=20)
    process = subprocess.Popen([sys.executable, "-m", "course_utils.train", *flags], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not out.last_checkpoint.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == preemption.EXIT_CODE, output
    assert "Ctrl-C: stopping after this step" in output and "stopped by SIGINT" in output
    assert checkpoint.load(out.last_checkpoint)["step"] < 5 * 8  # before the end: the run was stopped
    assert train(**{**quick, "out": str(out.path), "epochs": 5, "workers": 1}, resume="auto")["steps"] == 5 * 8


def _stand_in(folder: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``nvidia-smi`` that runs ``script``, on PATH ahead of any real one."""
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("nvidia-smi") == str(tool)


def test_a_hanging_nvidia_smi_is_passed_over_by_monitor_auto(tmp_path, monkeypatch):
    """What ``auto`` does for a run on a GPU (a run on the CPU samples the CPU without asking the tools)."""
    from course_utils.observe.monitor.backends import open_backend

    _stand_in(tmp_path, "sleep 60\n", monkeypatch)
    started = time.monotonic()
    assert open_backend("auto").name == "cpu" and time.monotonic() - started < 30


def test_an_nvidia_smi_that_starts_printing_garbage_stops_the_monitor_not_the_run(quick, tmp_path, monkeypatch):
    counter = tmp_path / "calls"
    script = (f'echo x >> "{counter}"\n'
              f'if [ "$(wc -l < "{counter}")" -le 2 ]; then cat <<"EOF"\n{NVIDIA_SMI}EOF\n'
              'else printf "garbage\\n#!@\\n"; fi\n')
    _stand_in(tmp_path, script, monkeypatch)
    with pytest.warns(RuntimeWarning, match="monitor: nvidia-smi stopped after"):
        summary = train(**{**quick, "max_steps": 6, "input_delay_ms": 100}, monitor="nvidia-smi",
                        monitor_interval=0.05)
    monitor = summary["monitor"]
    assert "printed output that is not its readings" in monitor["failure"] and monitor["samples"] >= 1
    assert json.loads(RunFolder(quick["out"]).summary.read_text())["steps"] == 6


@pytest.mark.slow
@pytest.mark.distributed
def test_a_full_disk_during_a_sharded_save_is_one_line_on_each_rank(tiny_root, tmp_path, small_disk, fsdp_run):
    """Two FSDP ranks write their shards to a disk with room for about one and a half checkpoints (a checkpoint's
    size read from the session's FSDP run: the same model, optimizer and batch on 2 ranks)."""
    options = dict(size="ci", data_dir=str(tiny_root), model="small_cnn_gn", train_samples=256, test_samples=64,
                   batch_size=16, log_every=1, workers=0, device="cpu", progress=False, distributed="fsdp")
    one = checkpoint.step_path(RunFolder(fsdp_run[1]).checkpoints, 2, sharded=True)
    size = sum(path.stat().st_size for path in one.rglob("*") if path.is_file())
    disk = small_disk(int(1.5 * size) + 256 * 1024)
    result = launch(2, "course_utils.train", *to_flags(**options, max_steps=8, checkpoint_every=1,
                                                       out=str(disk / "run")),
                    log_dir=tmp_path / "logs", echo=False, timeout_seconds=300)
    ranks = [line for line in result.lines if line.startswith("[default")]  # torchrun adds a report of its own
    errors = [line for line in ranks if "error:" in line]
    assert not result.ok and len(errors) == 2, "\n".join(ranks[-40:])
    assert all("disk full writing" in line and "--resume auto" in line for line in errors), "\n".join(errors)
    assert not any("Traceback" in line for line in ranks), "\n".join(ranks[-40:])
    newest = checkpoint.candidates(RunFolder(disk / "run").checkpoints)[0]
    assert checkpoint.load(newest)["step"] >= 1  # the last whole checkpoint is kept, and verifies
