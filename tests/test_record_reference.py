"""benchmarks/record_reference.sh: the plan runs whole on the CPU (its dry run), a run cut short keeps what it
finished and says what it left, and a timing taken while another process used the GPU is not recorded as a GPU
figure."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

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
def test_the_dry_run_records_every_benchmark_into_its_run_folder_only(tmp_path):
    before = set((ROOT / "benchmarks" / "results").iterdir())
    out = tmp_path / "run"
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out), "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
