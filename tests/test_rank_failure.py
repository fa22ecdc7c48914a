"""A DDP rank that dies: the others stop within bounded time and name it (torchrun's restart resuming the run:
test_crash_restart.py, whose one restarted launch serves it too). Ranks that meet the same error a moment apart
each say so before torchrun ends them."""

import textwrap
import time

import pytest

from course_utils.parallel.launch import launch
from course_utils.training.options import to_flags

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # torchrun and two DDP ranks in every test


def _options(tiny_root, out, **extra):
    return to_flags(size="ci", data_dir=tiny_root, model="small_cnn_gn", train_samples=256, test_samples=32, epochs=2,
                    batch_size=8, workers=2, log_every=2, checkpoint_every=4, device="cpu", progress=False,
                    distributed="ddp", out=out, **extra)


def test_a_dead_rank_ends_the_job_quickly_and_is_named(tiny_root, tmp_path):
    out = tmp_path / "run"
    start = time.monotonic()
    result = launch(2, "course_utils.train", *_options(tiny_root, out, crash_at_step=4), log_dir=tmp_path / "logs",
                    echo=False, timeout_seconds=300)
    assert not result.ok
    assert time.monotonic() - start < 120  # rank 0 did not wait out the 600 s collective timeout
    text = "\n".join(result.lines)
    assert "rank      : 1" in text or "rank: 1" in text, text[-2000:]
    assert "Signal 9 (SIGKILL)" in text or "exitcode  : -9" in text


LATE_ERROR = textwrap.dedent('''
    import sys, time
    from course_utils.parallel import process_group

    where = process_group.join(timeout_seconds=60, backend="gloo")
    process_group.leave(together=True)  # a rank that left at once could close gloo's connection to the other mid-join
    time.sleep(float(sys.argv[1]) if where.rank == 0 else 0)  # rank 0 meets the error later, as on a busy machine
    print(f"error: rank {where.rank} stops here", file=sys.stderr, flush=True)
    if sys.argv[2] == "together":
        process_group.stop_with_the_others()
    process_group.end_process(1)
''')


@pytest.mark.parametrize("ending", ["alone", "together"])
def test_ranks_that_meet_an_error_a_moment_apart_each_say_so(tmp_path, ending):
    """torchrun ends every rank once one exits with an error: rank 0, three seconds behind rank 1, is killed
    before its line unless each rank waits for the others after reporting."""
    script = tmp_path / "late_error.py"
    script.write_text(LATE_ERROR)
    result = launch(2, str(script), "3", ending, log_dir=tmp_path / "logs", echo=False, timeout_seconds=120)
    said = sorted(line.split("error: ")[1] for line in result.lines if "error: rank" in line)
    if ending == "alone":  # the cause, reproduced
        assert said == ["rank 1 stops here"] and "(SIGTERM)" in "\n".join(result.lines), "\n".join(result.lines)
    else:
        assert said == ["rank 0 stops here", "rank 1 stops here"], "\n".join(result.lines)
        assert result.failed_ranks == [0, 1] or result.failed_ranks == [1, 0]


def test_a_rank_that_fails_alone_waits_for_the_others_only_a_bounded_time(tmp_path):
    script = tmp_path / "late_error.py"
    script.write_text(LATE_ERROR)
    start = time.monotonic()
    result = launch(2, str(script), "60", "together", log_dir=tmp_path / "logs", echo=False, timeout_seconds=120)
    assert not result.ok and time.monotonic() - start < 40, "\n".join(result.lines)
    assert [line.split("error: ")[1] for line in result.lines if "error: rank" in line] == ["rank 1 stops here"]
