"""A run folder, or a data root, that other users can write in: a link planted under a name the course writes is
never followed. Each test plants a link to a stand-in for a file the run's owner cares about (their
``authorized_keys``) and checks that the stand-in is untouched and the run says why it stopped."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from course_utils.observe.tensorboard import EventFile, read_scalars
from course_utils.run_folder import RunFolder
from course_utils.shared_folders import PlantedLink, make_folder, open_file
from course_utils.train import main
from course_utils.training import preemption
from course_utils.training.options import to_flags

KEYS = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIStandIn owner@laptop\n"


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """A file of the run's owner outside the run folder, that a planted link points at."""
    keys = tmp_path / "home" / ".ssh" / "authorized_keys"
    keys.parent.mkdir(parents=True)
    keys.write_text(KEYS)
    return keys


def _planted(folder: RunFolder, name: str, stand_in: Path) -> Path:
    """A link named ``name`` in the run folder to the stand-in, or to its folder for a name that is a folder."""
    link = folder.path / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(stand_in.parent if name in ("tensorboard", "checkpoints") else stand_in)
    return link


@pytest.mark.parametrize("name", [".hold", "metrics.jsonl", "summary.json", "tensorboard", "monitor.csv",
                                  "PREEMPTED", "checkpoints", "checkpoints/last.pt"])
def test_a_run_refuses_a_link_planted_in_its_folder_and_writes_nothing_through_it(quick, stand_in, capsys, name):
    folder = RunFolder(quick["out"])
    before = sorted(path.name for path in stand_in.parent.iterdir())
    link = _planted(folder, name, stand_in)
    assert main(to_flags(**{**quick, "max_steps": 2}, monitor="cpu")) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {link} is a symbolic link (to {os.readlink(link)}), where the course writes "
                            "a file of its own; nothing was written through it"), error
    assert f"Remove it (rm {link})" in error
    assert stand_in.read_text() == KEYS and sorted(path.name for path in stand_in.parent.iterdir()) == before
    assert [path.name for path in folder.path.iterdir()] == [name.split("/")[0]]  # refused before any write


@pytest.fixture
def shared_space() -> Iterator[Path]:
    """A folder every user may write in (a project's shared space), outside pytest's folders, which only their
    owner may enter."""
    folder = Path(tempfile.mkdtemp(prefix="course-shared-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder)


def test_a_link_planted_by_another_user_in_a_shared_run_folder_is_refused(quick, shared_space, capsys):
    """A real second user (``nobody``) plants a link in a run folder in a shared space; the run's owner then starts
    the run, which must not write their stand-in ``authorized_keys`` (a private one in the same space)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second user")
    other = pwd.getpwnam("nobody")
    keys = shared_space / "owner" / "authorized_keys"
    keys.parent.mkdir(mode=0o711)
    keys.write_text(KEYS)
    folder = RunFolder(shared_space / "run")
    folder.path.mkdir()
    folder.path.chmod(0o777)  # as a group-writable project folder lets the group
    subprocess.run(["setpriv", f"--reuid={other.pw_uid}", f"--regid={other.pw_gid}", "--clear-groups", "--",
                    "ln", "-s", str(keys), str(folder.metrics)], check=True)
    assert folder.metrics.lstat().st_uid == other.pw_uid != os.geteuid()
    assert main(to_flags(**{**quick, "max_steps": 2, "out": str(folder.path)})) == 1
    assert f"error: {folder.metrics} is a symbolic link (to {keys})" in capsys.readouterr().err
    assert keys.read_text() == KEYS


RACER = """import sys
from pathlib import Path
from course_utils.shared_folders import new_folder
print("ready", flush=True)
sys.stdin.readline()
print(new_folder(Path(sys.argv[1])), flush=True)
"""


def test_runs_that_propose_one_folder_at_once_get_one_each_and_none_through_a_link(tmp_path, stand_in):
    """Runs started in the same second propose the same clock-named folder: four processes make theirs at once,
    beside a link planted under that name, which none of them follows."""
    proposed = tmp_path / "runs" / "small_cnn-20250101-120000"
    proposed.parent.mkdir()
    proposed.symlink_to(stand_in.parent)
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(proposed)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for _ in range(4)]
    assert [racer.stdout.readline() for racer in racers] == ["ready\n"] * 4
    for racer in racers:  # all four wait at their readline: one line each starts them together
        racer.stdin.write("go\n")
        racer.stdin.flush()
    made = sorted(Path(racer.communicate(timeout=60)[0].strip()) for racer in racers)
    assert made == [proposed.with_name(f"{proposed.name}-{number}") for number in range(2, 6)]
    assert all(folder.is_dir() and not folder.is_symlink() for folder in made)
    assert [path.name for path in stand_in.parent.iterdir()] == ["authorized_keys"]


def test_a_file_is_opened_neither_through_a_link_nor_through_a_second_name(tmp_path, stand_in):
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(stand_in)
    for mode in ("w", "a", "a+", "wb"):
        with pytest.raises(PlantedLink, match="is a symbolic link"):
            open_file(link, mode)
    hard = tmp_path / ".hold"
    os.link(stand_in, hard)  # a second name of the same file: writing one writes the other
    for mode in ("a", "a+"):
        with pytest.raises(PlantedLink, match="a file with other names"):
            open_file(hard, mode)
    with open_file(hard, "w") as stream:  # a new file in its place: the other name keeps its content
        stream.write("the run's own\n")
    assert stand_in.read_text() == KEYS and hard.read_text() == "the run's own\n"
    fifo = tmp_path / "monitor.csv"
    os.mkfifo(fifo)
    with pytest.raises(PlantedLink, match="not a regular file"):
        open_file(fifo, "a")
    folder = tmp_path / "tensorboard"
    folder.symlink_to(stand_in.parent)
    with pytest.raises(PlantedLink, match="is a symbolic link"):
        make_folder(folder)
    assert stand_in.read_text() == KEYS


def test_a_marker_written_whole_replaces_a_planted_link_instead_of_following_it(tmp_path, stand_in):
    folder = RunFolder(tmp_path / "run")
    _planted(folder, "PREEMPTED", stand_in)
    preemption.mark(folder, 12, "SIGTERM")
    assert not folder.preempted.is_symlink() and "after step 12" in folder.preempted.read_text()
    assert stand_in.read_text() == KEYS


def test_tensorboard_reads_the_events_the_run_writes_itself_and_hides_those_after_a_resume(tmp_path):
    logs = tmp_path / "tensorboard"
    first = EventFile(logs)
    for step in (1, 2, 3, 4):
        first.scalars({"train/loss": 1.0 / step, "train/lr": 0.1}, step)
    first.close()
    resumed = EventFile(logs, purge_step=3)  # resumed from the checkpoint of step 2: steps 3 and 4 are redone
    resumed.scalars({"train/loss": 0.5}, 3)
    resumed.close()
    loss = read_scalars(logs).query("tag == 'train/loss'").sort_values("step")
    assert list(loss.step) == [1, 2, 3] and loss.value.tolist() == pytest.approx([1.0, 0.5, 0.5])


def test_a_shared_data_root_follows_no_link_at_a_download_or_at_its_write_check(tmp_path, stand_in):
    """A class's data root: a link planted as a download's ``.part`` file, or under the name of the write check."""
    from data_prep import archives, guard

    root = tmp_path / "data"
    root.mkdir()
    source = tmp_path / "served" / "annotations.zip"
    source.parent.mkdir()
    source.write_bytes(b"the archive's bytes")
    partial = root / "annotations.zip.part"
    partial.symlink_to(stand_in)
    with pytest.raises(PlantedLink) as refused:
        archives.download(source.as_uri(), root / "annotations.zip")
    assert guard.explain(refused.value, root).startswith(f"{partial} is a symbolic link (to {stand_in})")
    (root / f".write-check-{os.getpid()}").symlink_to(stand_in)  # the name the check used to write
    guard.check_writable(root)
    assert stand_in.read_text() == KEYS
