"""Folders replaced whole or not at all: generated data, extracted archives and sharded checkpoints use this."""

import pytest

from course_utils.atomic_files import replace_directory, whole_directory


def test_a_written_folder_replaces_the_old_one_and_nothing_else_is_left(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with whole_directory(target) as staging:
        (staging / "new.txt").write_text("new")
    assert [path.name for path in target.iterdir()] == ["new.txt"]
    assert [path.name for path in tmp_path.iterdir()] == ["data"]


def test_a_failed_write_leaves_the_old_folder(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), whole_directory(target) as staging:
        (staging / "half.txt").write_text("half")
        raise RuntimeError("interrupted")
    assert [path.name for path in target.iterdir()] == ["old.txt"]
    assert [path.name for path in tmp_path.iterdir()] == ["data"]


def test_replacing_a_folder_with_a_staged_one(tmp_path):
    staged, target = tmp_path / ".staged", tmp_path / "step-1.dcp"
    for folder, name in ((staged, "new"), (target, "old")):
        folder.mkdir()
        (folder / name).write_text(name)
    replace_directory(staged, target)
    assert [path.name for path in target.iterdir()] == ["new"] and not staged.exists()
    assert [path.name for path in tmp_path.iterdir()] == ["step-1.dcp"]
