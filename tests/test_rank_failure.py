"""Ranks that meet the same error a moment apart each say so before torchrun ends them (a DDP rank that dies, the
others stopped within bounded time and the dead one named: test_crash_restart.py, whose one restarted launch
shows both)."""

import textwrap
import time

import pytest

from course_utils.parallel.launch import launch

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # torchrun and two gloo ranks in every test


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
