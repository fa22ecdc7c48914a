"""torchrun from a notebook cell: every rank's output streamed, failures shown, the whole group ended on a
timeout or an interrupt: every process of the launch, however its ranks hang."""

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from waiting import wait_until

from course_utils.parallel import launched_processes
from course_utils.parallel.launch import (
    LAUNCHER_FAILED,
    LIMIT_VARIABLE,
    TIME_LIMITS,
    LauncherTraceback,
    launch,
    time_limit,
)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # every test here starts torchrun and its ranks


def test_streams_every_rank_and_returns_the_exit_code(torchrun_self_check):
    """The session's one run of the self-check (see conftest), read for what launch made of it."""
    result, streamed = torchrun_self_check.result, torchrun_self_check.streamed
    assert result.ok and result.returncode == 0, "\n".join(result.lines[-30:])
    assert "[default0]:[rank 0/2]" in streamed and "[default1]:[rank 1/2]" in streamed
    assert sorted(result.rank_logs) == [0, 1] and "ok (backend gloo" in result.rank_logs[1]
    assert not torchrun_self_check.left_behind  # its logs read, the launch's own log folder is gone


def test_failure_shows_the_tail_of_each_rank_log(tmp_path, capsys):
    """And what an earlier attempt wrote to the launch's outputs is gone: a cell that reads them after this failed
    launch finds nothing, not the earlier attempt's results."""
    record, folder = tmp_path / "out" / "record.json", tmp_path / "out" / "ranks"
    folder.mkdir(parents=True)
    record.write_text("{}")
    (folder / "rank0.pt").write_bytes(b"earlier")
    result = launch(2, "course_utils.no_such_module", log_dir=tmp_path / "logs", outputs=[record, folder])
    assert not result.ok
    assert not record.exists() and folder.is_dir() and not any(folder.iterdir())
    streamed = capsys.readouterr()
    err = streamed.err
    assert "--- rank 0:" in err and "--- rank 1:" in err and "No module named" in err
    # torchrun's own traceback is kept in the result, not shown: its report names the failed ranks
    assert any("elastic_launch(" in line for line in result.lines)
    assert "elastic_launch(" not in streamed.out and "torchrun's own traceback left out" in streamed.out
    assert "ChildFailedError" in streamed.out and "Root Cause (first observed failure)" in streamed.out


HANGING_RANKS = Path(__file__).with_name("ranks_that_hang.py")
# How many times each way of hanging is tried; the launcher's fault was timing-dependent, so one try is not enough.
REPEATS = int(os.environ.get("COURSE_TEST_REPEATS", "2"))
TAG = "COURSE_TEST_LAUNCH"  # set for the ranks through launch's env: every process of the launch inherits it


def _processes_of(tag: str) -> list[psutil.Process]:
    """The processes (zombies aside) whose environment carries ``TAG=tag``: torchrun, its ranks, their workers."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(TAG) == tag and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _interrupt_when_in_position(ready: Path, stopped_rank: int | None = None, timeout: float = 240) -> None:
    """Send this process SIGINT (Jupyter's interrupt) once both ranks wrote their pid to ``ready`` (and
    ``stopped_rank`` is stopped), or after ``timeout`` seconds."""
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = {int(path.name): int(text) for path in ready.iterdir() if (text := path.read_text())}
            if len(pids) == 2 and (stopped_rank is None or
                                   psutil.Process(pids[stopped_rank]).status() == psutil.STATUS_STOPPED):
                break
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, daemon=True).start()


def _stands(told: str) -> dict[int, tuple[int, str, str]]:
    """rank -> (pid, state, last line) as the launcher's message tells them."""
    return {int(rank): (int(pid), state, line) for rank, pid, state, line in
            re.findall(r"rank (\d+) \(pid (\d+)\) was (.+?) and last printed '(.*?)'", told)}


def _not_stopped(told: str) -> set[int]:
    """The ranks the launcher's message names as not stopped after SIGTERM."""
    sentence = re.search(r"\. ([^.]*) did not stop within", told)
    return {int(rank) for rank in re.findall(r"rank (\d+)", sentence.group(1))} if sentence else set()


@pytest.mark.parametrize("attempt", range(REPEATS))
@pytest.mark.parametrize(("scenario", "stopped_rank", "not_stopped"),
                         [("ignores-sigterm", None, {1}), ("stopped", 1, set()), ("collective", None, {0, 1})])
def test_an_interrupt_ends_every_process_of_the_launch_and_says_where_each_rank_stood(
        tmp_path, capsys, scenario, stopped_rank, not_stopped, attempt):
    """Real gloo ranks under torchrun, each in a session of its own: one ignores SIGTERM, or is stopped, or is
    blocked in a collective beside loader workers. Jupyter's interrupt ends them all before launch returns."""
    ready = tmp_path / "ready"
    ready.mkdir()
    tag = f"{scenario}-{attempt}-{os.getpid()}"
    # A kernel turns SIGINT into KeyboardInterrupt; a suite started as a background job inherits it ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_when_in_position(ready, stopped_rank)
        with pytest.raises(KeyboardInterrupt):
            launch(2, str(HANGING_RANKS), scenario, str(ready), log_dir=tmp_path / "logs", echo=False,
                   env={TAG: tag})
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not _processes_of(tag), "the launch left processes behind"
    told = capsys.readouterr().err
    pids = {int(path.name): int(path.read_text()) for path in ready.iterdir()}
    stands = _stands(told)
    assert {rank: pid for rank, (pid, _, _) in stands.items()} == pids, told  # the ranks, not their workers
    assert all(line.startswith(f"rank {rank}: ") for rank, (_, _, line) in stands.items()), told
    if stopped_rank is not None:
        assert stands[stopped_rank][1].startswith("stopped"), told
    assert _not_stopped(told) == not_stopped, told
    assert "Every process of the launch has ended" in told


def test_the_time_limit_ends_every_process_and_names_the_rank_that_did_not_stop(tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    tag = f"limit-{os.getpid()}"
    with pytest.raises(TimeoutError) as raised:
        launch(2, str(HANGING_RANKS), "ignores-sigterm", str(ready), log_dir=tmp_path / "logs", echo=False,
               timeout_seconds=60, env={TAG: tag})
    assert not _processes_of(tag), "the launch left processes behind"
    told = str(raised.value)
    assert told.startswith("torchrun ran past its limit of 60 s, and was ended: where each rank stood: rank 0 (pid")
    assert _not_stopped(told) == {1} and set(_stands(told)) == {0, 1}, told
    assert told.endswith(f"Every process of the launch has ended (the logs are in {tmp_path / 'logs'})")


@pytest.mark.parametrize("value", ["nan", "0", "-5", "inf", "ten minutes"])
def test_a_time_limit_that_is_not_a_positive_number_of_seconds_is_refused(monkeypatch, value):
    monkeypatch.setenv(LIMIT_VARIABLE, value)
    with pytest.raises(ValueError, match=f"{LIMIT_VARIABLE}='{value}' is not a positive number of seconds"):
        time_limit()
    with pytest.raises(ValueError, match="a positive number of seconds"):
        launch(2, "timeit", "pass", timeout_seconds=float(value) if value != "ten minutes" else -1.0)


def test_a_launch_without_a_limit_takes_the_course_sizes(monkeypatch):
    monkeypatch.delenv(LIMIT_VARIABLE, raising=False)
    monkeypatch.setenv("COURSE_SIZE", "ci")
    assert time_limit() == TIME_LIMITS["ci"]
    monkeypatch.setenv(LIMIT_VARIABLE, "90")
    assert time_limit() == 90


def test_loader_workers_are_not_counted_as_ranks():
    """What the launcher's message names: processes that carry RANK, less those whose parent carries it too
    (a DataLoader worker inherits its rank's environment), here real processes under a stand-in torchrun that
    carries a RANK of its own (a kernel started inside another job)."""
    script = "RANK=0 sleep 60 & RANK=1 bash -c 'sleep 60 & sleep 60 & wait' & wait"
    process = subprocess.Popen(["bash", "-c", script], start_new_session=True, env={**os.environ, "RANK": "7"})
    try:
        # until the three sleeps have been exec'd: before, a forked child shows its parent's RANK=7 (or none)
        wait_until(lambda: [child.cmdline() for child in psutil.Process(process.pid).children(recursive=True)
                            ].count(["sleep", "60"]) == 3, "the three sleeps' exec")
        children = psutil.Process(process.pid).children(recursive=True)
        found = launched_processes.ranks([psutil.Process(process.pid), *children], {process.pid})
        assert sorted(found.values()) == [0, 1]
        assert {psutil.Process(pid).ppid() for pid in found} == {process.pid}
        assert sorted(launched_processes.ranks(children).values()) == [0, 1]  # torchrun gone: the same ranks
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


FAILING = """import os, signal, sys
if os.environ["RANK"] == "1" and sys.argv[1] == "raise":
    raise AttributeError("'DistributedSampler' object has no attribute 'set_epock'")
if os.environ["RANK"] == "1" and sys.argv[1] in ("abort", "abort-while-rank-0-waits"):
    os.kill(os.getpid(), signal.SIGABRT)  # as a C++ teardown that calls std::terminate
if os.environ["RANK"] == "0" and sys.argv[1] == "abort-while-rank-0-waits":
    import time
    time.sleep(120)  # still running when rank 1 dies: torchrun ends it, and it did nothing wrong
print("rank", os.environ["RANK"], "ended cleanly")
"""


@pytest.mark.oldest
@pytest.mark.parametrize("how", ["raise", "abort", "abort-while-rank-0-waits"])
def test_the_failed_rank_is_named_whether_it_raised_or_died_of_a_signal(tmp_path, how):
    """Only the rank that failed: not one that torchrun ended because another had failed."""
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


def test_only_torchruns_own_child_failed_traceback_is_left_out_of_the_cell():
    other = ["Traceback (most recent call last):\n", '  File "run.py", line 3, in <module>\n', "ValueError: boom\n"]
    filtered = LauncherTraceback()
    assert [shown for line in other for shown in filtered.shown(line)] == other  # any other error, shown whole
    failed = other[:2] + ["[default1]:a rank's late line\n", f"{LAUNCHER_FAILED}: \n", "  rank      : 1\n"]
    shown = [shown for line in failed for shown in filtered.shown(line)]
    assert shown[0] == "[default1]:a rank's late line\n" and "left out: 2 lines" in shown[1] and shown[2:] == failed[3:]


def test_every_notebook_launch_that_writes_results_removes_an_earlier_runs_first():
    """A cell that reads a launch's results after a failed launch must not find the previous attempt's: every
    launch in a notebook that writes to --out or a results folder names its outputs."""
    import json

    missing = []
    for notebook in sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or source.startswith("%%writefile"):
                continue
            for call in re.findall(r"(?:\blaunch|run_script)\((?:[^()]|\([^()]*\))*\)", source):
                if ('"--out"' in call or "run_script" in call) and "outputs=" not in call:
                    missing.append(f"{notebook.name}: {call[:80]}")
    assert not missing, missing
