"""torchrun from a notebook cell: every rank's output streamed, failures shown, the whole group ended on a
timeout or an interrupt."""

import os
import signal
import subprocess
import threading
import time

import psutil
import pytest

from course_utils.parallel.launch import LIMIT_VARIABLE, TIME_LIMITS, launch, running_ranks, time_limit

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # every test here starts torchrun and its ranks


def test_streams_every_rank_and_returns_the_exit_code(torchrun_self_check):
    """The session's one run of the self-check (see conftest), read for what launch made of it."""
    result, streamed = torchrun_self_check.result, torchrun_self_check.streamed
    assert result.ok and result.returncode == 0, "\n".join(result.lines[-30:])
    assert "[default0]:[rank 0/2]" in streamed and "[default1]:[rank 1/2]" in streamed
    assert sorted(result.rank_logs) == [0, 1] and "ok (backend gloo" in result.rank_logs[1]


def test_failure_shows_the_tail_of_each_rank_log(tmp_path, capsys):
    result = launch(2, "course_utils.no_such_module", log_dir=tmp_path)
    assert not result.ok
    err = capsys.readouterr().err
    assert "--- rank 0:" in err and "--- rank 1:" in err and "No module named" in err


def _survivors(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


def _assert_all_ended(marker: str, timeout: float = 10.0) -> None:
    """Every process started with ``marker`` in its command line ends within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while survivors := _survivors(marker):
        assert time.monotonic() < deadline, f"still running {timeout:.0f} s after the end: {survivors}"
        time.sleep(0.1)


def test_timeout_ends_the_whole_group(tmp_path):
    marker = str(tmp_path)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="ran past its limit of 3 s"):
        # timeit with a huge count keeps both ranks busy until they are ended
        launch(2, "timeit", "-n", "1000000000", "pass", log_dir=tmp_path, timeout_seconds=3, echo=False)
    assert time.monotonic() - start < 60
    _assert_all_ended(marker)


def test_interrupting_the_cell_ends_the_whole_group(tmp_path):
    """Jupyter's interrupt is a SIGINT to the kernel: launch must take every rank down with it."""
    marker = str(tmp_path)
    # A kernel turns SIGINT into KeyboardInterrupt; a suite started as a background job inherits it ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(3, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            launch(2, "timeit", "-n", "1000000000", "pass", log_dir=tmp_path, echo=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    _assert_all_ended(marker)


def test_a_launch_without_a_limit_takes_the_course_sizes(monkeypatch):
    monkeypatch.delenv(LIMIT_VARIABLE, raising=False)
    monkeypatch.setenv("COURSE_SIZE", "ci")
    assert time_limit() == TIME_LIMITS["ci"]
    monkeypatch.setenv(LIMIT_VARIABLE, "90")
    assert time_limit() == 90
    monkeypatch.setenv(LIMIT_VARIABLE, "ten minutes")
    with pytest.raises(ValueError, match="not a number of seconds"):
        time_limit()


def test_the_ranks_still_running_are_named_by_their_rank_and_pid():
    """What the time limit's error names: torchrun's children that carry RANK, here two real processes of which
    rank 0 has exited and rank 1 still runs (as a rank that hangs at the end of a run)."""
    script = "RANK=0 true; RANK=1 sleep 60 & wait"
    process = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (named := running_ranks(process)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(named) == 1 and named[0].startswith("rank 1 (pid ")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


FAILING = """import os, signal, sys
if os.environ["RANK"] == "1" and sys.argv[1] == "raise":
    raise AttributeError("'DistributedSampler' object has no attribute 'set_epock'")
if os.environ["RANK"] == "1" and sys.argv[1] == "abort":
    os.kill(os.getpid(), signal.SIGABRT)  # as a C++ teardown that calls std::terminate
print("rank", os.environ["RANK"], "ended cleanly")
"""


@pytest.mark.parametrize("how", ["raise", "abort"])
def test_the_failed_rank_is_named_whether_it_raised_or_died_of_a_signal(tmp_path, how):
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    result = launch(2, str(script), how, log_dir=tmp_path / "logs", timeout_seconds=240, echo=False)
    assert not result.ok and result.failed_ranks == [1], "\n".join(result.lines[-30:])


def test_a_clean_launch_after_a_failed_one_into_the_same_log_folder_reads_only_its_own_logs(tmp_path):
    """The logs of the failed attempt stay in the folder; the next launch's ranks are judged by their own."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    failed = launch(2, str(script), "raise", log_dir=tmp_path / "logs", timeout_seconds=240, echo=False)
    assert failed.failed_ranks == [1] and "set_epock" in failed.rank_logs[1]
    clean = launch(2, str(script), "none", log_dir=tmp_path / "logs", timeout_seconds=240, echo=False)
    assert clean.ok and clean.failed_ranks == [], "\n".join(clean.lines[-30:])
    assert "set_epock" not in clean.rank_logs[1] and "ended cleanly" in clean.rank_logs[1]
