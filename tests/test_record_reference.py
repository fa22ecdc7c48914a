"""benchmarks/record_reference.sh: the plan runs whole on the CPU (its dry run), a run cut short keeps what it
finished and says what it left, and a timing taken while another process used the GPU is not recorded as a GPU
figure. A stop signal (SIGTERM, SIGHUP, Ctrl-C) ends the running tasks, every process of each, and leaves a
summary; a read-only results folder or a full disk ends in a summary that names what could not be written; two
copies started in the same second each get a folder of their own."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "record_reference.sh"


def _orchestrator():
    spec = importlib.util.spec_from_file_location("record_reference", ROOT / "benchmarks" / "record_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_dry_run_records_every_benchmark_into_its_run_folder_only(tmp_path, run_to_end):
    """... and ends within seconds of its last line."""
    before = set((ROOT / "benchmarks" / "results").iterdir())
    out = tmp_path / "run"
    run_to_end(["bash", str(SCRIPT), "--dry-run", "--out", str(out), "--data-dir", str(tmp_path / "data")],
               env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}).assert_ended(0)
    assert set((ROOT / "benchmarks" / "results").iterdir()) == before  # a dry run records nothing there
    recorded = {json.loads(path.read_text())["benchmark"]: json.loads(path.read_text())
                for path in (out / "results").glob("*.json")}
    assert set(recorded) == {"ceilings", "progression", "monitor_cost", "loaders"}
    assert all(result["device"] == "CPU" and result["goals"] for result in recorded.values())
    assert (out / "notebooks" / "00_setup.ipynb").is_file()
    text = (out / "summary.txt").read_text()
    assert "not GPU figures" in text and "Not done: nothing" in text
    for name in ("ceilings", "progression 224 px", "progression 32 px", "monitor cost", "loaders", "notebook 00"):
        assert f"- {name}" in text and "done" in text.split(f"- {name}")[1].splitlines()[0]
    assert "bf16 matmul, share of the dense peak" in text and "noise floor" in text


def _writes_then_sleeps(name: str, seconds: float) -> list[str]:
    """A stand-in benchmark: records one result at once, then works for ``seconds``."""
    code = ("import json, os, pathlib, time\n"
            f"pathlib.Path(os.environ['COURSE_RESULTS_DIR'], '{name}.json').write_text(json.dumps("
            f"{{'benchmark': '{name}', 'goals': []}}))\n"
            f"time.sleep({seconds})\n")
    return ["-c", code]


def _run(orchestrator, tasks, tmp_path, budget, pci=""):
    out = tmp_path / "run"
    (out / "logs").mkdir(parents=True)
    run = orchestrator.Run(tasks, out, budget, sys.executable, {"PATH": "/usr/bin:/bin"}, tmp_path / "results", pci,
                           [0])
    while run.step():
        time.sleep(0.05)
    return run


def test_a_run_cut_short_keeps_what_it_recorded_and_names_what_it_left(tmp_path, monkeypatch):
    orchestrator = _orchestrator()
    tasks = [orchestrator.Task("first", _writes_then_sleeps("first", 0), "gpu", 1),
             orchestrator.Task("long", _writes_then_sleeps("long", 120), "gpu", 1),
             orchestrator.Task("never", _writes_then_sleeps("never", 0), "gpu", 1)]
    monkeypatch.setattr(orchestrator, "GRACE_SECONDS", 0)  # the third cannot start before the second is cut
    _run(orchestrator, tasks, tmp_path, budget=8)
    assert [task.status for task in tasks] == ["done", "cut at the budget", "not started: out of time"]
    assert sorted(path.name for path in (tmp_path / "results").iterdir()) == ["first.json", "long.json"]
    text = orchestrator.summary(tasks, "Test GPU", 8, 8, tmp_path / "results", tmp_path / "run")
    assert "Not done: long, never" in text and "- long: cut at the budget" in text


def test_a_timing_taken_beside_another_process_on_the_gpu_is_not_a_gpu_figure(tmp_path, monkeypatch):
    orchestrator = _orchestrator()
    monkeypatch.setattr(orchestrator, "gpu_processes", lambda pci: {1, 2})  # ids of no process of this run
    tasks = [orchestrator.Task("crowded", _writes_then_sleeps("crowded", 1), "gpu", 1)]
    _run(orchestrator, tasks, tmp_path, budget=120, pci="0000:c1:00")
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").iterdir())
    assert [path.name for path in (tmp_path / "run" / "contended").iterdir()] == ["crowded.json"]
    assert "not recorded as GPU figures" in tasks[0].note


def test_the_tasks_own_processes_on_the_gpu_are_not_others():
    orchestrator = _orchestrator()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert orchestrator.others_on_the_gpu({child.pid}, child.pid) == 0
        assert orchestrator.others_on_the_gpu({child.pid, 1}, child.pid) == 1
        assert orchestrator.others_on_the_gpu({10**7 + 1}, child.pid) == 0  # another namespace's id: the task's own
        assert orchestrator.others_on_the_gpu({10**7 + 1, 10**7 + 2}, child.pid) == 1
        assert orchestrator.others_on_the_gpu(None, child.pid) == 0
    finally:
        child.kill()
        child.wait()


def _as_a_terminal_starts_it() -> None:
    """SIGINT and SIGHUP as a terminal's foreground job has them (a test runner started in the background may
    have left them ignored, and an ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Recorder:
    """``record_reference.sh --dry-run ARGS`` started for real, its output read as it comes."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            ["bash", str(SCRIPT), "--dry-run", "--data-dir", str(tmp_path / "data"), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_a_terminal_starts_it,
            env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", **(env or {})})
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.readers = [threading.Thread(target=self._read, args=(name,), daemon=True) for name in self.lines]
        for reader in self.readers:
            reader.start()

    def _read(self, name: str) -> None:
        for line in getattr(self.process, name):
            self.lines[name].append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.lines["stdout"])

    @property
    def stderr(self) -> str:
        return "".join(self.lines["stderr"])

    def wait_for(self, pattern: str, timeout: float = 300) -> re.Match:
        """The first match of ``pattern`` in what it printed, waiting for it while it runs."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.stdout, re.MULTILINE)):
            assert self.process.poll() is None, f"ended before {pattern!r}:\n{self.stdout}\n{self.stderr}"
            assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n{self.stdout}\n{self.stderr}"
            time.sleep(0.05)
        return match

    def running_tasks(self, count: int = 1, timeout: float = 300) -> dict[int, str]:
        """pid -> command of its running tasks (each leads a session of its own), once there are ``count``."""
        deadline = time.monotonic() + timeout
        while True:
            tasks = {}
            for child in psutil.Process(self.process.pid).children():
                try:
                    if os.getsid(child.pid) == child.pid and child.status() != psutil.STATUS_ZOMBIE:
                        tasks[child.pid] = " ".join(child.cmdline())
                except (psutil.Error, ProcessLookupError):
                    continue
            if len(tasks) >= count:
                return tasks
            assert self.process.poll() is None, f"ended before a task ran:\n{self.stdout}\n{self.stderr}"
            assert time.monotonic() < deadline, f"no task within {timeout} s:\n{self.stdout}\n{self.stderr}"
            time.sleep(0.05)

    def finish(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        return code


def _left_in(sessions: set[int]) -> list[str]:
    """The processes of ``sessions`` still there (``ps``), leaving out the exited ones their parent has not
    reaped yet, which hold nothing; given a few seconds to be reaped."""
    deadline = time.monotonic() + 5
    while True:
        table = subprocess.run(["ps", "-e", "-o", "pid=,sid=,stat=,args="], capture_output=True, text=True,
                               check=True).stdout
        left = [line for line in table.splitlines()
                if int(line.split()[1]) in sessions and not line.split()[2].startswith("Z")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda number: number.name)
def test_a_stop_signal_ends_every_process_of_the_running_tasks_and_leaves_a_summary(tmp_path, stop):
    out = tmp_path / "run"
    recorder = Recorder(tmp_path, "--out", str(out))
    tasks = recorder.running_tasks(2)  # ci data and ceilings start at once, each in a session of its own
    sent = time.monotonic()
    recorder.process.send_signal(stop)
    code = recorder.finish()
    assert time.monotonic() - sent < 30, "the tasks were not ended within seconds"
    assert code == -stop, recorder.stdout + recorder.stderr  # it ends by the signal it was sent, as its sender expects
    assert "Traceback" not in recorder.stderr, recorder.stderr
    assert not _left_in(set(tasks)), f"left running: {_left_in(set(tasks))} (the tasks were {tasks})"
    text = (out / "summary.txt").read_text()
    assert text.strip() in recorder.stdout  # printed and written
    assert f"STOPPED by {stop.name}" in text
    assert f"- notebook 00 (ci): not started: stopped by {stop.name}" in text
    never = re.search(r"^  never started: (.*)$", text, re.MULTILINE).group(1).split(", ")
    assert {"progression 32 px", "monitor cost", "loaders", "notebook 00 (ci)"} <= set(never), text
    outcomes = {line["task"]: line["status"] for line in map(json.loads, (out / "log.jsonl").read_text().splitlines())}
    assert set(outcomes) == {"ci data", "ceilings"}, outcomes  # the two tasks that were running
    assert set(outcomes.values()) <= {"done", f"interrupted by {stop.name}"}, outcomes
    interrupted = {name for name, status in outcomes.items() if status != "done"}
    assert interrupted, outcomes  # seconds of work each: the signal came while at least one ran
    assert set(re.search(r"^  interrupted: (.*)$", text, re.MULTILINE).group(1).split(", ")) == interrupted


@pytest.mark.slow
def test_a_read_only_results_folder_keeps_the_results_in_the_run_folder_and_says_so(tmp_path, small_disk):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results").symlink_to(small_disk(1 << 20, read_only=True))  # the dry run's results folder
    recorder = Recorder(tmp_path, "--out", str(out))
    recorder.wait_for(r"\]\s+done ceilings", timeout=300)  # a benchmark recorded its result
    assert recorder.process.poll() is None, "a result that could not be written ended the run"
    recorder.process.send_signal(signal.SIGTERM)  # the rest of the plan is not needed here
    assert recorder.finish() == -signal.SIGTERM
    assert "Traceback" not in recorder.stderr, recorder.stderr
    [kept] = (out / "staged" / "ceilings").glob("*.json")  # where the benchmark wrote it
    assert json.loads(kept.read_text())["benchmark"] == "ceilings"
    assert not list((out / "results").iterdir())
    text = (out / "summary.txt").read_text()
    assert "- ceilings: done" in text and "bf16 matmul, share of the dense peak" in text  # read where it was kept
    assert f"Results kept: {kept.name} in {kept.parent}" in text
    assert f"- {out / 'results' / kept.name}: Read-only file system; kept in {kept}" in text
    assert text.strip() in recorder.stdout


@pytest.mark.slow
def test_a_full_disk_ends_in_a_printed_summary_that_names_what_could_not_be_written(tmp_path, small_disk):
    out = small_disk(1 << 20)  # the run folder on a file system of 1 MiB
    recorder = Recorder(tmp_path, "--out", str(out))
    tasks = recorder.running_tasks()
    with (out / "filler").open("wb") as filler, pytest.raises(OSError) as full:  # another program fills the disk
        while True:
            filler.write(b"\0" * 65536)
            filler.flush()
    assert full.value.errno == errno.ENOSPC
    recorder.wait_for(r"^\[\s*\d+ s\]\s+(done|failed|interrupted)", timeout=300)  # a task ended, on the full disk
    time.sleep(1)
    assert recorder.process.poll() is None, f"the full disk ended the run:\n{recorder.stdout}\n{recorder.stderr}"
    tasks |= recorder.running_tasks()
    recorder.process.send_signal(signal.SIGTERM)
    assert recorder.finish() == -signal.SIGTERM
    assert "Traceback" not in recorder.stderr, recorder.stderr
    assert not _left_in(set(tasks))
    printed = recorder.stdout
    assert "STOPPED by SIGTERM" in printed and "Not done: " in printed
    assert re.search(rf"^- {re.escape(str(out / 'log.jsonl'))}: No space left on device; the lines of .+ are missing",
                     printed, re.MULTILINE), printed
    assert "summary.txt could not be written" in printed and "No space left on device" in printed
    assert "this screen is the only copy of the summary" in recorder.stderr
    assert not (out / "summary.txt").exists() and not list(out.glob(".summary.txt*"))  # no half-written summary


@pytest.mark.slow
def test_two_copies_started_in_the_same_second_get_folders_of_their_own(tmp_path):
    runs = tmp_path / "runs"
    others = []  # the folders another copy started in each of the coming seconds holds
    for second in range(-2, 120):
        folder = runs / f"reference-{datetime.now() + timedelta(seconds=second):%Y%m%d-%H%M%S}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "log.jsonl").write_text("another copy's log\n")
        others.append(folder)
    copies = [Recorder(tmp_path, env={"COURSE_RUNS_DIR": str(runs)}) for _ in range(2)]
    folders = [Path(copy.wait_for(r"^run folder (.+)$").group(1)) for copy in copies]
    for copy in copies:
        copy.process.send_signal(signal.SIGTERM)
    assert [copy.finish() for copy in copies] == [-signal.SIGTERM] * 2
    assert folders[0] != folders[1], "two copies shared one run folder"
    for folder, copy in zip(folders, copies):
        assert folder.parent == runs and folder not in others
        assert re.fullmatch(r"reference-\d{8}-\d{6}-\d+", folder.name)  # the second's name, then a free suffix
        assert f"executed notebooks in {folder}\n" in (folder / "summary.txt").read_text()
        assert "Traceback" not in copy.stderr
    assert all([path.name for path in folder.iterdir()] == ["log.jsonl"] for folder in others)
    assert all((folder / "log.jsonl").read_text() == "another copy's log\n" for folder in others)


def test_a_run_folder_that_holds_a_run_or_cannot_be_written_is_refused_before_anything_runs(tmp_path, small_disk):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "log.jsonl").write_text("an earlier run's log\n")
    read_only = small_disk(1 << 20, read_only=True)
    for out, said in ((taken, f"{taken} already holds a run (its log.jsonl): give --out a new folder"),
                      (read_only / "run", "the run folder cannot be written")):
        result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True,
                                env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}, timeout=120)
        assert result.returncode == 2 and said in result.stderr and "nothing was run" in result.stderr
        assert "Traceback" not in result.stderr, result.stderr
    assert (taken / "log.jsonl").read_text() == "an earlier run's log\n"


def test_every_notebook_runs_in_one_of_the_two_runs_each_of_which_fits_its_budget(tmp_path):
    """The benchmarks' run hides the GPU from the notebooks beside it, so it holds only those whose every training
    runs on CPU ranks; the others (07 and 08 also train in the notebook's own process) run with the GPU visible in
    the second run. Each run's estimates (an H200's seconds) fit the default nine minutes."""
    recorder = _orchestrator()
    benchmarks = recorder.plan(False, tmp_path, tmp_path / "data")
    notebooks = recorder.plan(False, tmp_path, tmp_path / "data", notebooks=True)
    planned = [re.match(r"notebook (\d\d) ", task.name).group(1) for task in benchmarks + notebooks
               if task.name.startswith("notebook")]
    shipped = sorted(path.name[:2] for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(planned) == shipped  # each once
    hidden = {task.name[9:11] for task in benchmarks if task.env.get("CUDA_VISIBLE_DEVICES") == ""}
    assert hidden == {"09", "11"}
    assert not any(task.env.get("CUDA_VISIBLE_DEVICES") == "" for task in notebooks)
    lane_seconds = {lane: sum(t.estimate for t in benchmarks if t.lane == lane) for lane in ("data", "gpu", "cpu")}
    usable = 540 - recorder.GRACE_SECONDS
    assert lane_seconds["data"] + max(lane_seconds["gpu"], lane_seconds["cpu"]) <= usable, lane_seconds
    two_at_a_time = sum(t.estimate for t in notebooks if t.lane == "notebooks") / 2
    assert sum(t.estimate for t in notebooks if t.lane == "data") + two_at_a_time <= usable


def test_a_relative_run_folder_is_the_same_folder_for_every_task(tmp_path, monkeypatch):
    """A notebook's kernel runs in notebooks/: a run folder given as ``--out runs/ref`` is made absolute first, so
    that its notebooks' runs and results land in it, not in a folder of that name under notebooks/."""
    monkeypatch.chdir(tmp_path)
    folder = _orchestrator().claim_run_folder(Path("runs") / "ref")
    assert folder == tmp_path / "runs" / "ref" and (folder / "log.jsonl").is_file()


def test_a_dry_run_of_the_notebooks_run_is_refused_before_anything_runs(tmp_path, capsys):
    """``--dry-run --notebooks`` ran the benchmarks' dry plan, the flag unread: it is refused, and says why."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as refused:
        _orchestrator().main(["--dry-run", "--notebooks", "--out", str(out)])
    assert refused.value.code == 2
    said = capsys.readouterr().err
    assert "--notebooks has no dry run" in said and "run --dry-run alone" in said, said
    assert not out.exists()
