"""Faults a data_prep command meets on a cluster, each made real: a Slurm stop (SIGTERM) or a kill (SIGKILL)
in the middle of writing a data set, a data root that is a file, on a read-only file system or on one that
fills up during ImageNet's extraction. Each ends in one line that names the fix, leaves no half-made folder
behind, and the same command then finishes from what was kept."""

import os
import signal
import subprocess
import sys
import time

import pytest

from course_utils.atomic_files import staging_folder
from course_utils.data import coco as coco_data
from course_utils.data import generated_imagenet
from data_prep import cifar100, imagenet, tiny_cifar100
from data_prep.__main__ import main as prepare_course_data


def _leftovers(root):
    """Staging folders of ``root`` beside it: what a stopped write would leave behind."""
    return sorted(p.name for p in root.parent.iterdir() if p.name.startswith(f".{root.name}-"))


def _start_tiny_coco(root):
    """``python -m data_prep.tiny_coco`` at photo sizes (tens of seconds of JPEG encoding), in its own session
    as a Slurm job step is, returned once it writes into its staging folder."""
    command = [sys.executable, "-m", "data_prep.tiny_coco", "--root", str(root), "--train", "3000",
               "--photo-sizes"]
    process = subprocess.Popen(command, start_new_session=True, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any((root.parent / name / "train2017").is_dir() for name in _leftovers(root)):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "the generator never started writing"
        time.sleep(0.05)
    return process


@pytest.mark.slow
def test_a_stop_signal_during_data_prep_removes_its_staging_folder(tmp_path):
    root = tmp_path / "coco"
    process = _start_tiny_coco(root)
    os.killpg(process.pid, signal.SIGTERM)  # what scancel and the time limit send to the job's processes
    _, error = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert error.strip().splitlines()[-1].startswith("stopped by SIGTERM: no half-extracted folder is left")
    assert _leftovers(root) == [] and not any(root.iterdir())  # the folder the data would go to, still empty


@pytest.mark.slow
def test_what_a_killed_data_prep_left_is_removed_by_the_next_run(tmp_path):
    root = tmp_path / "coco"
    process = _start_tiny_coco(root)
    os.killpg(process.pid, signal.SIGKILL)  # no clean-up can run: the OOM killer, scancel after KillWait
    process.wait(timeout=60)
    assert len(_leftovers(root)) == 1  # the fault: a staging folder with a partial data set
    finished = subprocess.run([sys.executable, "-m", "data_prep.tiny_coco", "--root", str(root), "--train", "4",
                               "--val", "4"], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert _leftovers(root) == [] and coco_data.problems(root) == []


def test_a_live_process_keeps_its_staging_folder(tmp_path):
    """The next run removes only a dead process's folder: two extractions into one root do not collide."""
    script = ("import sys, time; from course_utils.atomic_files import staging_folder; "
              "print(staging_folder(sys.argv[1], '.extract-'), flush=True); time.sleep(60)")
    writer = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        live = writer.stdout.readline().strip()
        mine = staging_folder(tmp_path, ".extract-")
        assert os.path.isdir(live) and mine.is_dir()
    finally:
        writer.kill()
        writer.wait()
    assert staging_folder(tmp_path, ".extract-").is_dir() and not os.path.exists(live) and mine.is_dir()


def test_a_data_root_that_is_a_file_is_named_with_the_variable_that_set_it(monkeypatch, tmp_path, capsys):
    in_the_way = tmp_path / "scratch"
    in_the_way.write_text("a file where the data folder should be")
    monkeypatch.setenv("COURSE_DATA_DIR", str(in_the_way))
    assert prepare_course_data(["--size", "ci"]) == 1
    assert capsys.readouterr().err.strip() == (f"error: {in_the_way} is a file where a folder belongs: move it away "
                                               f"or point COURSE_DATA_DIR (now {in_the_way}) at another folder")
    assert tiny_cifar100.main(["--root", str(in_the_way / "tiny")]) == 1
    assert capsys.readouterr().err.strip().endswith("is a file where a folder belongs: move it away or choose "
                                                    "another --root")


def test_a_read_only_data_root_is_refused_in_one_line_and_a_finished_tree_still_verifies(small_disk, capsys):
    disk = small_disk(8 << 20)
    assert tiny_cifar100.main(["--root", str(disk / "tiny"), "--train", "100", "--test", "100"]) == 0
    small_disk(8 << 20, read_only=True)  # a shared data set mounted read-only, as on many clusters
    assert tiny_cifar100.main(["--root", str(disk / "more"), "--train", "100"]) == 1
    assert capsys.readouterr().err.strip() == (f"error: {disk / 'more'} is on a read-only file system: choose "
                                               f"another --root on a writable one (on LUMI, project scratch)")
    assert cifar100.main(["--root", str(disk / "tiny"), "--verify"]) == 0


def test_a_prepared_data_set_on_a_read_only_file_system_is_verified_and_left_as_it_is(monkeypatch, small_disk,
                                                                                       capsys):
    """A class's shared copy of the data, mounted read-only: the course's own data_prep finds it whole."""
    disk = small_disk(64 << 20)
    monkeypatch.setenv("COURSE_DATA_DIR", str(disk))
    assert prepare_course_data(["--size", "ci"]) == 0
    small_disk(64 << 20, read_only=True)
    capsys.readouterr()
    assert prepare_course_data(["--size", "ci"]) == 0
    assert capsys.readouterr().out.count("verified, nothing to do") == 2


@pytest.mark.slow
def test_a_full_disk_during_imagenet_extraction_says_so_and_the_rerun_continues(tmp_path, small_disk, capsys):
    made = generated_imagenet.generate(tmp_path / "archives", classes=4, train_per_class=40, val_per_class=5)
    sums = made / generated_imagenet.MD5SUMS
    disk = small_disk(200 << 10)  # room for about one class of the four
    command = ["--archives", str(made), "--root", str(disk / "imagenet"), "--md5sums", str(sums)]
    assert imagenet.main(command) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: disk full writing {disk / 'imagenet'}")
    assert error.endswith("then run the same command again; what was finished is kept")
    staged = disk / "imagenet" / imagenet.STAGING / "train"
    kept = [p.name for p in staged.iterdir() if (p / imagenet.MARKER).is_file()]
    assert kept  # the classes extracted before the disk filled
    small_disk(4 << 20)
    assert imagenet.main(command) == 0
    assert imagenet.verify(disk / "imagenet") == []
