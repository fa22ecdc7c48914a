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
    path = checkpoint.save_atomic({"model": {}, "step": 1}, RunFolder(tmp_path).last_checkpoint)
    with pytest.raises(RuntimeError, match="simulated"):
        checkpoint.save_atomic({"model": {}, "step": 2, "bad": Unpicklable()}, path)
    assert checkpoint.load(path)["step"] == 1
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_loading_refuses_code_and_says_why(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "f": print}, path)  # a reference to a callable: code, not data
    with pytest.raises(checkpoint.DamagedCheckpoint, match=f"{path} holds objects other than tensors.*could run code"):
        checkpoint.load(path)


@pytest.mark.parametrize("damage", ["truncated", "zero-filled", "empty"])
def test_a_damaged_file_is_named_without_unsafe_advice(tmp_path, damage):
    path = checkpoint.save_atomic({"model": {"w": torch.ones(100)}, "step": 1}, tmp_path / "last.pt")
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "zero-filled": bytes(len(data)), "empty": b""}[damage])
    with pytest.raises(checkpoint.DamagedCheckpoint, match=f"{path} is damaged") as caught:
        checkpoint.load(path)
    assert "weights_only" not in str(caught.value)


def test_random_bytes_are_not_a_checkpoint_and_not_said_to_hold_code(tmp_path):
    """Random files make PyTorch's loader fail in many ways (UnpicklingError, IndexError, KeyError...); each is a
    file that is not a checkpoint, and only a file that refers to code is said to hold it."""
    generator = torch.Generator().manual_seed(0)
    for number in range(40):
        path = tmp_path / f"random-{number}.pt"
        path.write_bytes(bytes(torch.randint(0, 256, (4096,), generator=generator, dtype=torch.uint8).tolist()))
        with pytest.raises(checkpoint.DamagedCheckpoint) as caught:
            checkpoint.load(path)
        assert str(caught.value).startswith(f"{path} is damaged: 4096 bytes that are not a whole PyTorch checkpoint")


def test_checkpoints_a_resume_passed_over_never_push_out_the_whole_ones(tmp_path):
    """A run resumed from step 2 past damaged checkpoints of steps 10 and 12 keeps its own newest two."""
    for step in (10, 12):
        checkpoint.step_path(tmp_path, step).write_bytes(b"damaged")
    kept = []
    for step in (2, 5, 6):
        checkpoint.save_keeping({"model": {"w": torch.full((3,), float(step))}, "step": step}, tmp_path, step)
        kept.append(sorted(int(path.name[5:13]) for path in tmp_path.glob("step-*")))
    assert kept == [[2, 10, 12], [2, 5, 10, 12], [5, 6, 10, 12]]


def test_kept_checkpoints_are_independent_files(tmp_path):
    for step in (1, 2):
        checkpoint.save_keeping({"model": {"w": torch.full((3,), float(step))}, "step": step}, tmp_path, step)
    last, newest = tmp_path / "last.pt", checkpoint.step_path(tmp_path, 2)
    assert last.read_bytes() == newest.read_bytes() and not last.samefile(newest)
    newest.write_bytes(bytes(newest.stat().st_size))  # damage in place reaches no other file
    assert checkpoint.load(last)["step"] == 2
