import pytest
import torch

from course_utils.run_folder import RunFolder
from course_utils.training import checkpoint


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("simulated crash in the middle of a write")


def test_round_trip(tmp_path):
    path = checkpoint.save_atomic({"model": {"w": torch.arange(3.0)}, "step": 7}, RunFolder(tmp_path).last_checkpoint)
    loaded = checkpoint.load(path)
    assert loaded["step"] == 7 and torch.equal(loaded["model"]["w"], torch.arange(3.0))


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    path = checkpoint.save_atomic({"step": 1}, RunFolder(tmp_path).last_checkpoint)
    with pytest.raises(RuntimeError, match="simulated"):
        checkpoint.save_atomic({"step": 2, "bad": Unpicklable()}, path)
    assert checkpoint.load(path)["step"] == 1
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_loading_refuses_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"f": print}, path)  # a reference to a callable: code, not data
    with pytest.raises(Exception, match="weights_only|Unsupported|global"):
        checkpoint.load(path)
